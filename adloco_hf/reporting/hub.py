"""Hub uploads: the repo id a run pushes to and one client for every upload (merges and the merged model).

The Hub may be out of reach for a while (offline machines, network blips, rate limits). Every call to it is tried
`PUSH_ATTEMPTS` times, `PUSH_RETRY_SECONDS` apart (doubling). A merge that cannot be uploaded during training is
logged at WARNING and training goes on: the folder is on disk. The final model's upload, at the end of training or
when asked for, raises one [`HubUploadError`] that names the local folder holding the model and the repo.
"""

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ..common.distributed import all_gather_rows
from .model_card import ModelCardMixin, full_folder_of


__all__ = [
    "PUSH_ATTEMPTS",
    "PUSH_RETRY_SECONDS",
    "HubUploadError",
    "MergedModelHubMixin",
    "create_hub_repo",
    "get_hub_api",
    "hub_repo_id",
    "push_folder",
    "push_run_folder",
]

logger = logging.getLogger(__name__)

PUSH_ATTEMPTS = 3  # tries of each Hub call before giving up
PUSH_RETRY_SECONDS = 2.0  # wait before the second try, doubled before each further one


class HubUploadError(RuntimeError):
    """An upload to the Hub failed after every try. `folder` holds the model on disk; `repo_id` is where it was
    going. The error of the last try is chained (`__cause__`)."""

    def __init__(self, folder: str, repo_id: str, reason: str, path_in_repo: str | None = None):
        self.folder, self.repo_id, self.path_in_repo = folder, repo_id, path_in_repo
        target = f"{repo_id}/{path_in_repo}" if path_in_repo else repo_id
        super().__init__(
            f"could not upload {folder} to the Hub repo {target}: {reason}. The model is saved on disk in {folder}; "
            f"upload it once the Hub can be reached with `hf upload {repo_id} {folder}"
            + (f" {path_in_repo}`" if path_in_repo else "`")
            + " or trainer.push_merged_to_hub()."
        )


def hub_repo_id(hub_model_id: str | None, output_dir: str) -> str:
    """The repo a run pushes to: `hub_model_id`, else the name of its output folder (the Trainer's own fallback)."""
    return hub_model_id or os.path.basename(os.path.abspath(output_dir))


def get_hub_api(token: str | None = None):
    """The `huggingface_hub.HfApi` used for every upload (tests replace this function with a recording fake)."""
    from huggingface_hub import HfApi

    return HfApi(token=token)


def _is_permanent(error: Exception) -> bool:
    """A refusal that trying again cannot change: the Hub answered 4xx (bad token, no access), but not 408 or 429."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


def _with_retries(call: Callable[[], Any], what: str) -> Any:
    """`call()`, tried `PUSH_ATTEMPTS` times; the last error is raised with a note of how many tries were made."""
    for attempt in range(1, PUSH_ATTEMPTS + 1):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - any failure of the Hub client is worth another try
            if attempt == PUSH_ATTEMPTS or _is_permanent(error):
                with contextlib.suppress(AttributeError):
                    error.adloco_tries = attempt  # for the message of HubUploadError
                raise
            wait = PUSH_RETRY_SECONDS * 2 ** (attempt - 1)
            logger.info("%s failed (%s: %s); try %d of %d in %.3gs", what, type(error).__name__, error,
                        attempt + 1, PUSH_ATTEMPTS, wait)  # fmt: skip
            time.sleep(wait)
    raise AssertionError("unreachable")


def _reason(error: Exception) -> str:
    tries = getattr(error, "adloco_tries", 1)
    return f"{type(error).__name__}: {error} (after {tries} {'try' if tries == 1 else 'tries'})"


def create_hub_repo(repo_id: str, *, token: str | None = None, private: bool | None = None) -> str:
    """Create the repo if needed (tried `PUSH_ATTEMPTS` times); returns its full id (namespace/name)."""
    api = get_hub_api(token)
    return _with_retries(
        lambda: api.create_repo(repo_id, private=private, exist_ok=True).repo_id, f"creating {repo_id}"
    )


def push_folder(
    folder: str,
    *,
    repo_id: str,
    path_in_repo: str | None = None,
    commit_message: str,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    ensure_repo: bool = True,
):
    """Create the repo if needed (unless `ensure_repo=False`) and upload `folder` to it (to `path_in_repo`, the
    root by default). Each Hub call is tried `PUSH_ATTEMPTS` times; then [`HubUploadError`] names `folder` and the
    repo, with the last error chained.
    """
    try:
        if ensure_repo:
            repo_id = create_hub_repo(repo_id, token=token, private=private)
        api = get_hub_api(token)
        return _with_retries(
            lambda: api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                path_in_repo=path_in_repo,
                commit_message=commit_message,
                revision=revision,
            ),
            f"uploading {folder} to {repo_id}",
        )
    except Exception as error:  # noqa: BLE001 - one error type for every way an upload can fail
        raise HubUploadError(folder, repo_id, _reason(error), path_in_repo) from error


def push_run_folder(
    folder: str,
    args,
    *,
    hub_model_id: str | None = None,
    commit_message: str,
    path_in_repo: str | None = None,
    repo_id: str | None = None,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
):
    """`push_folder` with what the caller leaves out taken from the run's `TrainingArguments` (`hub_model_id`,
    `hub_token`, `hub_private_repo`, `hub_revision`); `hub_model_id` is the id the Trainer resolved at init."""
    return push_folder(
        folder,
        repo_id=repo_id or hub_repo_id(hub_model_id or args.hub_model_id, args.output_dir),
        path_in_repo=path_in_repo,
        commit_message=commit_message,
        token=token if token is not None else args.hub_token,
        private=private if private is not None else args.hub_private_repo,
        revision=revision if revision is not None else args.hub_revision,
    )


class MergedModelHubMixin(ModelCardMixin):
    """The Trainer's Hub methods, aimed at the merged model (mixed into `AdLoCoTrainer` before `Trainer`).

    Checkpoints hold per-worker resume state and stay local; merges and the merged model go to the Hub, all through
    `get_hub_api`. Needs the Trainer's `args`, `hub_model_id`, `is_world_process_zero` and AdLoCo's
    `save_merged_model` and `worker`.
    """

    def _hub_location(self, folder: str) -> tuple[str, str | None] | None:
        """(repo id, folder in the repo) a folder of this run goes to with `push_to_hub=True` (for its card)."""
        if not self.args.push_to_hub:
            return None
        relative = os.path.relpath(os.path.abspath(folder), os.path.abspath(self.args.output_dir))
        if relative not in ("merged", "merged-full") and os.path.dirname(relative) != "merges":
            return None
        repo = hub_repo_id(self.hub_model_id or self.args.hub_model_id, self.args.output_dir)
        return repo, None if relative == "merged" else relative.replace(os.sep, "/")

    def push_merged_to_hub(
        self,
        repo_id: str | None = None,
        *,
        commit_message: str = "AdLoCo merged model",
        token: str | None = None,
        private: bool | None = None,
        revision: str | None = None,
    ):
        """Upload `{output_dir}/merged/` (saved first if missing; with `save_merged_full`, `merged-full/` too, to the
        repo's `merged-full/`) from global rank 0 (collective). Its card is rewritten first to load from the repo.

        Raises:
            HubUploadError: on every rank, when the upload failed after `PUSH_ATTEMPTS` tries; it names the local
                folder that holds the model and the repo.
        """
        folder = os.path.join(self.args.output_dir, "merged")
        if not os.path.isdir(folder) or not self.worker.final_merged:
            self.save_merged_model(folder)
        result, error = None, None
        if self.is_world_process_zero():
            try:
                result = self._push_merged(folder, repo_id, commit_message, token, private, revision)
            except HubUploadError as failed:
                error = failed
        # Every rank learns whether rank 0's upload failed, so all of them raise (none waits for the others).
        if any(row[0] for row in all_gather_rows([error is not None], self.args.device)):
            raise error or HubUploadError(folder, self.hub_model_id or "the run's repo", "global rank 0 failed")
        return result

    def _push_merged(self, folder, repo_id, commit_message, token, private, revision):
        target = repo_id or hub_repo_id(self.hub_model_id or self.args.hub_model_id, self.args.output_dir)
        token = token if token is not None else self.args.hub_token
        private = private if private is not None else self.args.hub_private_repo
        try:
            target = create_hub_repo(target, token=token, private=private)
        except Exception as cause:  # noqa: BLE001 - one error type for every way an upload can fail
            raise HubUploadError(folder, target, _reason(cause)) from cause
        self.write_merged_cards(folder, repo_id=target)  # the card's snippet now loads from the repo
        full = full_folder_of(folder) if self.args.save_merged_full else None
        result = None
        for source, path_in_repo in ((folder, None), (full, "merged-full")):
            if source is not None and os.path.isdir(source):
                uploaded = push_folder(
                    source,
                    repo_id=target,
                    path_in_repo=path_in_repo,
                    commit_message=commit_message,
                    token=token,
                    revision=revision if revision is not None else self.args.hub_revision,
                    ensure_repo=False,
                )
                result = uploaded if path_in_repo is None else result
        return result

    def push_at_end_of_training(self) -> None:
        """The end-of-training upload (`push_to_hub=True`, from `on_train_end`); a failure is kept and raised by
        `train()` once it has returned from every callback, so reporting callbacks still see the end of training."""
        try:
            self.push_merged_to_hub(commit_message="AdLoCo merged model (end of training)")
        except HubUploadError as error:
            self._hub_error = error

    def train(self, *args, **kwargs):
        """`Trainer.train`; then the end-of-training upload's [`HubUploadError`], if it failed (the trained model is
        on disk, in the folder the error names; the `TrainOutput` is its `train_output`)."""
        self._hub_error = None
        output = super().train(*args, **kwargs)
        error, self._hub_error = self._hub_error, None
        if error is not None:
            error.train_output = output
            raise error
        return output

    def push_during_training(self, folder: str, *, path_in_repo: str, commit_message: str) -> bool:
        """Upload a merge while training goes on: after `PUSH_ATTEMPTS` failed tries it is logged at WARNING and
        training continues (the folder is on disk). Returns whether it was uploaded."""
        try:
            push_run_folder(
                folder,
                self.args,
                hub_model_id=self.hub_model_id,
                path_in_repo=path_in_repo,
                commit_message=commit_message,
            )
            return True
        except HubUploadError as error:
            logger.warning("%s Training goes on.", error)
            return False

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token=None,
        revision=None,
        private=None,
        **kwargs,
    ):
        """The model worth sharing is the merged one: same as `push_merged_to_hub`."""
        return self.push_merged_to_hub(
            commit_message=commit_message or "AdLoCo merged model", token=token, revision=revision, private=private
        )

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the repo through the same Hub client as every other upload of this trainer. A Hub out of reach
        does not stop training: a WARNING is logged and the repo is created at the first upload."""
        if not self.is_world_process_zero():
            return
        repo_id = hub_repo_id(self.args.hub_model_id, self.args.output_dir)
        try:
            self.hub_model_id = create_hub_repo(
                repo_id,
                token=token if token is not None else self.args.hub_token,
                private=private if private is not None else self.args.hub_private_repo,
            )
        except Exception as error:  # noqa: BLE001 - the run can train without the Hub; uploads try again later
            logger.warning(
                "could not create the Hub repo %s (%s: %s); training goes on and every upload tries again",
                repo_id, type(error).__name__, error,
            )  # fmt: skip
            self.hub_model_id = repo_id
        self.push_in_progress = None

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Checkpoints hold per-worker resume state and stay local; merges and the merged model go to the Hub."""
