"""The guides a new user looks for (issue 41): docs/troubleshooting.md quotes messages the code still prints,
docs/choosing_settings.md quotes only numbers of the pages it cites, docs/multi_node.md's launch commands are found
and parsed (by `test_readme.py`'s checks of every documented command), and the README links all three."""

import ast
import glob
import os
import re
import shlex

import pytest
from helpers import REPO
from test_readme import RUNS, relative


DOCS = os.path.join(REPO, "docs")


def read(path: str) -> str:
    return open(path, encoding="utf-8").read()


def message_texts() -> list[str]:
    """Every string literal of the package, an f-string's values replaced by NUL (they match `…` in a heading)."""
    texts = []
    for path in glob.glob(os.path.join(REPO, "adloco_hf", "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(read(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                texts.append("".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values))
    return texts


def quoted_messages() -> list[str]:
    """The messages the troubleshooting page's headings quote (`### \\`...\\``)."""
    return re.findall(r"^### `(.+)`$", read(os.path.join(DOCS, "troubleshooting.md")), re.M)


def is_printed(quote: str, texts: list[str]) -> bool:
    """`quote` is in one string of the code, each `…` standing for a value the string fills in (or any text)."""
    pattern = ".*?".join(re.escape(piece) for piece in quote.split("…"))
    return any(re.search(pattern, text, re.S) for text in texts)


def test_every_heading_of_the_troubleshooting_page_quotes_a_message_of_the_code():
    quotes = quoted_messages()
    assert len(quotes) >= 15, quotes
    texts = message_texts()
    missing = [quote for quote in quotes if not is_printed(quote, texts)]
    assert not missing, f"docs/troubleshooting.md quotes messages the code no longer prints: {missing}"


def test_the_check_of_quoted_messages_can_fail():
    texts = message_texts()
    assert is_printed("resume_from_checkpoint=… does not exist", texts)
    assert not is_printed("resume_from_checkpoint=… was not found", texts)
    assert not is_printed("does not exist. … is a run's output_dir", texts)  # pieces of two messages


def units(text: str) -> list[str]:
    """The paragraphs, list items and table rows of a page, code blocks left out."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    parts = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        if lines[0].startswith("|"):
            parts += lines
        else:
            parts += re.split(r"\n(?=\* )", block)
    return parts


def test_every_number_of_the_settings_page_is_in_the_page_it_cites():
    """A decimal number of docs/choosing_settings.md must appear, as written, in a page or results file that the
    same paragraph, list item or table row links to."""
    page = os.path.join(DOCS, "choosing_settings.md")
    checked = 0
    for unit in units(read(page)):
        numbers = re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", unit)
        if not numbers:
            continue
        cited = [target.partition("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", unit)]
        cited = [os.path.normpath(os.path.join(DOCS, target)) for target in cited if target and "://" not in target]
        assert cited, f"docs/choosing_settings.md quotes {numbers} without citing a page: {unit[:200]}"
        sources = " ".join(read(path) for path in cited)
        for number in numbers:
            assert number in sources, f"{number} is in none of {[relative(p) for p in cited]}: {unit[:200]}"
            checked += 1
    assert checked >= 15, checked


@pytest.mark.parametrize("guide", ["troubleshooting.md", "multi_node.md", "choosing_settings.md"])
def test_the_readme_links_every_guide(guide):
    assert f"](docs/{guide})" in read(os.path.join(REPO, "README.md"))


def test_the_multi_node_commands_are_checked():
    """accelerate launch, torchrun (static and c10d) and the SLURM script's `srun torchrun` are parsed with the
    launcher's parser and the recipe's own (`test_readme.test_every_documented_recipe_command_parses`)."""
    runs = [run for run in RUNS if run.command.path.endswith("multi_node.md")]
    assert {run.launcher for run in runs} == {"accelerate", "torchrun"}, runs
    assert any(run.command.text.startswith("srun torchrun") for run in runs), [r.command.text for r in runs]
    assert len(runs) >= 5 and all(run.error is None for run in runs), [(str(r.command), r.error) for r in runs]


# ---- a docs block that reads another benchmark's results says so (issue 55) ----

RESULTS_INPUT = re.compile(r"outputs/benchmarks/([\w-]+)/.*\.json$")
WRITES = ("--output_dir", "--out", "--results_dir")


def results_read_without_saying(text: str) -> list[str]:
    """The `outputs/benchmarks/<name>/...json` files a shell block of `text` reads (an option's value) that no command
    of the block writes, and whose benchmark (`recipes.benchmarks.<name>`) neither the block nor the paragraph just
    before it names: a reader running the block alone would be missing them."""
    missing = []
    for block in re.finditer(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        before = text[: block.start()].rstrip().split("\n\n")[-1]
        written = []
        for line in block.group(1).replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            for option, value in zip(words, words[1:]):
                if option in WRITES:
                    written.append(value.rstrip("/") + "/")
                elif option.startswith("--") and (match := RESULTS_INPUT.match(value)):
                    made_here = any(value.startswith(folder) for folder in written)
                    if not made_here and f"recipes.benchmarks.{match.group(1)}" not in before + block.group(1):
                        missing.append(value)
    return missing


def test_every_docs_block_that_reads_another_benchmarks_results_names_it():
    """A block that reads another benchmark's results (`device_profile --throughput` reads gpu_bench's) says that a run
    of them comes first."""
    pages = glob.glob(os.path.join(DOCS, "*.md")) + glob.glob(
        os.path.join(REPO, "recipes", "**", "*.md"), recursive=True
    )
    missing = {relative(page): found for page in pages if (found := results_read_without_saying(read(page)))}
    assert not missing, missing


def test_the_check_of_blocks_that_read_results_can_fail():
    read = "outputs/benchmarks/gpu_bench/throughput.json"
    block = f"```bash\npython -m recipes.benchmarks.device_profile --throughput {read}\n```\n"
    assert results_read_without_saying("Replays a run.\n\n" + block) == [read]
    assert results_read_without_saying("Needs `recipes.benchmarks.gpu_bench`'s results first.\n\n" + block) == []
    made = "```bash\npython -m x --output_dir outputs/benchmarks/p\npython -m y --profile outputs/benchmarks/p/r.json\n```"
    assert results_read_without_saying(made) == []
