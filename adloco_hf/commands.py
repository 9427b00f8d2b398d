"""`adloco-hf`: what users do with a run once it has trained (also `python -m adloco_hf.cli`).

    adloco-hf summary outputs/demo              # the run's table: rounds, tokens, bytes, merges, batch sizes, evals
    adloco-hf plot outputs/demo                 # writes outputs/demo/adloco_run.png (or --out PATH)
    adloco-hf verify outputs/demo               # every checkpoint's manifest, every safetensors file, readable
    adloco-hf export outputs/demo my-model      # the merged model as a plain Hugging Face folder (--dtype bfloat16)
    adloco-hf push outputs/demo me/my-model     # the merged model to the Hub (`hf auth login` first)
    adloco-hf --version                         # adloco_hf's version and the releases it runs with
    adloco-hf lighthouse --min_workers 2        # the round quorum's lighthouse (`pip install 'adloco_hf[ft]'`)

A RUN is a training run's `output_dir`; `export` and `push` also take a model folder (`merged/`, `merges/outer-3/`).
Every command exits with 0 on success and 1 with an `error:` line (a damaged file, a missing folder, a failed
upload), so scripts can chain them.
"""

import argparse
import json
import os
import re
import shutil
import sys


# Each command imports what it uses: `--help`, `summary` and `plot` import neither torch nor transformers (seconds on
# a busy machine); `verify` reads checkpoints with torch, `export` and `push` load transformers and huggingface_hub.


__all__ = ["CommandError", "build_parser", "main", "safetensors_problems", "verify_folder", "version_line"]

_CARD = "README.md"
_MERGED = "merged"


class CommandError(Exception):
    """What a command reports as its `error:` line (exit status 1)."""


# ---- folders ----


def _is_model_folder(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, name)) for name in ("config.json", "adapter_config.json"))


def _is_checkpoint(path: str) -> bool:
    name = os.path.basename(os.path.normpath(path))
    return os.path.isdir(os.path.join(path, "adloco")) or re.fullmatch(r"checkpoint-\d+", name) is not None


def model_folder(source: str) -> str:
    """`source` itself when it holds a model (`config.json` or an adapter), else its run's `merged/`."""
    if _is_model_folder(source):
        return source
    merged = os.path.join(source, _MERGED)
    if _is_model_folder(merged):
        return merged
    raise CommandError(
        f"{source} is neither a model folder (with config.json or adapter_config.json) nor a run's output_dir with "
        f"{_MERGED}/ (training writes it at the end; `trainer.save_merged_model()` writes it on demand)"
    )


def run_folders(output_dir: str) -> list[str]:
    """The folders of a run worth verifying: its checkpoints (newest first), `merged/`, `merged-full/`, its merges."""
    from .checkpoint.manifest import checkpoints_newest_first

    folders = checkpoints_newest_first(output_dir)
    for name in (_MERGED, f"{_MERGED}-full"):
        if os.path.isdir(os.path.join(output_dir, name)):
            folders.append(os.path.join(output_dir, name))
    merges = os.path.join(output_dir, "merges")
    if os.path.isdir(merges):
        steps = sorted(n for n in os.listdir(merges) if re.fullmatch(r"outer-\d+", n))
        folders += [os.path.join(merges, n) for n in sorted(steps, key=lambda n: int(n.split("-")[1]))]
    return folders


# ---- verify ----


def safetensors_problems(folder: str) -> tuple[list[str], int, int]:
    """(problems, files, tensors): every `*.safetensors` file of `folder` opened and every tensor read, every shard a
    `*.safetensors.index.json` lists present. A truncated or overwritten file fails to open or to read."""
    from safetensors import safe_open

    problems, files, tensors = [], 0, 0
    names = sorted(os.listdir(folder))
    for index in (n for n in names if n.endswith(".safetensors.index.json")):
        try:
            with open(os.path.join(folder, index), encoding="utf-8") as f:
                shards = set(json.load(f)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.append(f"{index} is unreadable ({error})")
            continue
        problems += [f"{shard} (listed in {index}) is missing" for shard in sorted(shards) if shard not in names]
    for name in (n for n in names if n.endswith(".safetensors")):
        try:
            with safe_open(os.path.join(folder, name), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                    f.get_tensor(key)
                    tensors += 1
            files += 1
        except Exception as error:  # noqa: BLE001 - safetensors raises its own errors and OSError
            problems.append(f"{name} cannot be read ({type(error).__name__}: {error})")
    return problems, files, tensors


def verify_folder(folder: str) -> tuple[bool, str]:
    """(intact, what was checked or what is wrong) for a checkpoint (its manifest, then its safetensors files) or a
    model folder (its safetensors files)."""
    from .checkpoint.manifest import CheckpointDamagedError, verify_checkpoint

    checked = []
    if _is_checkpoint(folder):
        try:
            if verify_checkpoint(folder):
                with open(os.path.join(folder, "adloco", "manifest.json"), encoding="utf-8") as f:
                    checked.append(f"manifest ({len(json.load(f)['files'])} files: sizes and CRC-32)")
            else:
                checked.append("no manifest (written before AdLoCo checkpoints had one)")
        except CheckpointDamagedError as error:
            return False, str(error)
    problems, files, tensors = safetensors_problems(folder)
    if problems:
        return False, "; ".join(problems)
    if files == 0 and not _is_checkpoint(folder):
        return False, "no *.safetensors file"
    checked.append(f"{files} safetensors file(s), {tensors} tensors read")
    return True, ", ".join(checked)


def _verify(args) -> int:
    if not os.path.isdir(args.folder):
        raise CommandError(f"{args.folder} is not a folder")
    single = _is_checkpoint(args.folder) or _is_model_folder(args.folder)
    folders = [args.folder] if single else run_folders(args.folder)
    if not folders:
        raise CommandError(f"{args.folder} holds no checkpoint-N, {_MERGED}/ or merges/ folder, and no model")
    damaged = 0
    for folder in folders:
        intact, detail = verify_folder(folder)
        damaged += not intact
        name = os.path.relpath(folder, args.folder) if not single else folder
        print(f"{'ok' if intact else 'DAMAGED':8} {name}: {detail}")
    if damaged:
        raise CommandError(f"{damaged} of {len(folders)} folder(s) damaged")
    return 0


# ---- the card of an exported or pushed folder ----


def point_card_at(folder: str, model_id: str, subfolder: str | None = None, *, written_for: str | None = None) -> None:
    """Rewrite the snippet of `folder`'s card so that it loads from `model_id` (a Hub repo, or the exported folder)
    instead of the path the card was written with: strings of the `## Use` code that name a folder called as
    `written_for` (default: `folder`) is; a PEFT card's base model stays."""
    path = os.path.join(folder, _CARD)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        card = f.read()
    use = re.search(r"^## Use\n\n```python\n(.*?)^```", card, re.S | re.M)
    if use is None:
        return
    name = os.path.basename(os.path.normpath(written_for or folder))
    target = f'"{model_id}"' + (f', subfolder="{subfolder}"' if subfolder else "")

    def replace(match: re.Match) -> str:
        named = os.path.basename(os.path.normpath(match.group(1)))
        return target if named == name or match.group(1) == model_id else match.group(0)

    code = re.sub(r'"([^"\n]+)"(?:, subfolder="[^"\n]*")?', replace, use.group(1))
    with open(path, "w", encoding="utf-8") as f:
        f.write(card[: use.start(1)] + code + card[use.end(1) :])


# ---- export ----


def _export(args) -> int:
    import torch
    import transformers

    from .common.files import apply_umask_modes
    from .reporting.model_card import full_folder_of

    folder = model_folder(args.source)
    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        full = full_folder_of(folder)
        if not _is_model_folder(full):
            raise CommandError(
                f"{folder} holds a LoRA adapter, not a full model: train with save_merged_full=True (it writes "
                f"{full}/, the adapter fused into its base) or fuse it with peft: "
                "PeftModel.from_pretrained(base, folder).merge_and_unload().save_pretrained(dest)"
            )
        folder = full
    problems, _, _ = safetensors_problems(folder)
    if problems:
        raise CommandError(f"{folder} is damaged: {'; '.join(problems)}")
    if os.path.isdir(args.dest) and os.listdir(args.dest) and not args.overwrite:
        raise CommandError(f"{args.dest} exists and is not empty: choose another folder or pass --overwrite")
    config = transformers.AutoConfig.from_pretrained(folder)
    architecture = (config.architectures or [None])[0]
    model_class = getattr(transformers, architecture, None) if architecture else None
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else "auto"
    model = (model_class or transformers.AutoModel).from_pretrained(folder, dtype=dtype)
    model.save_pretrained(args.dest)
    if any(os.path.isfile(os.path.join(folder, n)) for n in ("tokenizer.json", "tokenizer_config.json")):
        transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(args.dest)
    if os.path.isfile(os.path.join(folder, _CARD)):
        shutil.copyfile(os.path.join(folder, _CARD), os.path.join(args.dest, _CARD))
        for image in re.findall(
            r"!\[[^\]]*\]\(([^)/]+)\)", open(os.path.join(folder, _CARD), encoding="utf-8").read()
        ):
            if os.path.isfile(os.path.join(folder, image)):
                shutil.copyfile(os.path.join(folder, image), os.path.join(args.dest, image))
        point_card_at(args.dest, args.dest, written_for=folder)
    apply_umask_modes(args.dest)  # save_pretrained's model.safetensors is 0600 (`common/files.py`)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"exported {folder} to {args.dest}: {type(model).__name__}, {parameters:,} parameters, {model.dtype}")
    return 0


# ---- push ----


def _push(args) -> int:
    from .reporting.hub import HubUploadError, create_hub_repo, push_folder
    from .reporting.model_card import full_folder_of

    folder = model_folder(args.source)
    full = full_folder_of(folder)
    sources = [(folder, None)] + ([(full, "merged-full")] if _is_model_folder(full) else [])
    for source, _ in sources:
        problems, _, _ = safetensors_problems(source)
        if problems:
            raise CommandError(f"{source} is damaged, not uploaded: {'; '.join(problems)}")
    try:
        repo_id = create_hub_repo(args.repo_id, token=args.token, private=args.private)
    except Exception as error:  # noqa: BLE001 - one error type for every way an upload can fail
        raise CommandError(str(HubUploadError(folder, args.repo_id, f"{type(error).__name__}: {error}"))) from error
    for source, path_in_repo in sources:
        point_card_at(source, repo_id, path_in_repo)  # the card now loads from the repo, as the trainer's push does
        try:
            push_folder(
                source,
                repo_id=repo_id,
                path_in_repo=path_in_repo,
                commit_message=args.commit_message,
                token=args.token,
                revision=args.revision,
                ensure_repo=False,
            )
        except HubUploadError as error:
            raise CommandError(str(error)) from error
        print(f"uploaded {source} to {repo_id}" + (f"/{path_in_repo}" if path_in_repo else ""))
    return 0


# ---- summary, plot ----


def _summary(args) -> int:
    from .reporting.report import format_summary, summarize_run

    try:
        summary = summarize_run(args.run)
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(str(error)) from error
    print(json.dumps(summary, indent=2, default=str) if args.json else format_summary(summary))
    return 0


def _plot(args) -> int:
    from .reporting.plotting import plot_run
    from .reporting.report import summarize_run

    try:
        summarize_run(args.run)  # the same checks, and their messages, as `summary`
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(str(error)) from error
    print(f"wrote {plot_run(args.run, args.out)}")
    return 0


def _lighthouse(args) -> int:
    from .quorum.lighthouse import LighthouseSettings, serve_lighthouse

    fields = ("port", "min_workers", "join_timeout", "heartbeat_timeout")
    try:
        settings = LighthouseSettings(**{name: getattr(args, name) for name in fields})
    except ValueError as error:
        raise CommandError(str(error)) from None
    try:
        serve_lighthouse(settings)
    except ImportError as error:  # torchft, an extra: the error names it
        raise CommandError(str(error)) from None
    return 0


def version_line() -> str:
    """`adloco-hf --version`: this package's version and the releases it runs with, read from the installed
    distributions' metadata (importing torch or transformers would take seconds)."""
    import importlib.metadata
    import platform

    from . import __version__

    releases = []
    for name in ("transformers", "accelerate", "torch"):
        try:
            releases.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            releases.append(f"{name} not installed")
    return f"adloco-hf {__version__} ({', '.join(releases)}, Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adloco-hf",
        description="What you do with an AdLoCo run once it has trained: summarise it, plot it, verify its "
        "checkpoints, export or push its merged model; and the lighthouse of live recovery's round quorum.",
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    summary = commands.add_parser("summary", help="print a run's summary table (from adloco_rounds.jsonl)")
    summary.add_argument("run", metavar="RUN", help="the run's output_dir")
    summary.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    summary.set_defaults(handler=_summary)

    plot = commands.add_parser("plot", help="draw a run's plot: batch sizes, instances, losses, bytes over tokens")
    plot.add_argument("run", metavar="RUN", help="the run's output_dir")
    plot.add_argument("--out", default=None, help="where to write the PNG (default: RUN/adloco_run.png)")
    plot.set_defaults(handler=_plot)

    verify = commands.add_parser(
        "verify", help="check a checkpoint (its manifest's sizes and CRC-32) and every safetensors file"
    )
    verify.add_argument(
        "folder", metavar="FOLDER", help="a checkpoint-N, a model folder, or a run's output_dir (all of its folders)"
    )
    verify.set_defaults(handler=_verify)

    export = commands.add_parser("export", help="save the merged model as a plain Hugging Face folder")
    export.add_argument("source", metavar="RUN_OR_MODEL", help="a run's output_dir (its merged/) or a model folder")
    export.add_argument("dest", metavar="DEST", help="the folder to write (from_pretrained loads it)")
    export.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="the weights' dtype"
    )
    export.add_argument("--overwrite", action="store_true", help="write into DEST even if it is not empty")
    export.set_defaults(handler=_export)

    push = commands.add_parser("push", help="upload the merged model (and merged-full/) to a Hub repo")
    push.add_argument("source", metavar="RUN_OR_MODEL", help="a run's output_dir (its merged/) or a model folder")
    push.add_argument("repo_id", metavar="REPO_ID", help="the Hub repo, e.g. me/my-model (created if needed)")
    push.add_argument("--private", action="store_true", default=None, help="create the repo private")
    push.add_argument("--revision", default=None, help="the branch to push to")
    push.add_argument("--token", default=None, help="a Hub token (default: the one `hf auth login` saved)")
    push.add_argument("--commit_message", default="AdLoCo merged model", help="the commit's message")
    push.set_defaults(handler=_push)

    lighthouse = commands.add_parser("lighthouse", help="run the round quorum's lighthouse (adloco_hf/quorum/)")
    lighthouse.add_argument("--port", type=int, default=29510, help="the port, on every interface (0: a free one)")
    lighthouse.add_argument("--min_workers", type=int, default=1, help="the fewest workers a round may have")
    lighthouse.add_argument(
        "--join_timeout",
        type=float,
        default=1800.0,
        help="seconds a quorum waits for a live, late worker (worker_timeout)",
    )
    lighthouse.add_argument(
        "--heartbeat_timeout",
        type=float,
        default=45.0,
        help="seconds of silence that make a worker dead (peer_timeout)",
    )
    lighthouse.set_defaults(handler=_lighthouse)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0, or 1 after an `error:` line on stderr; 2 for a usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.handler(args)
    except CommandError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
