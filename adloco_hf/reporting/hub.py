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


__all__ = [
    "PUSH_ATTEMPTS",
    "PUSH_RETRY_SECONDS",
    "HubUploadError",
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


def failure_reason(error: Exception) -> str:
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
        raise HubUploadError(folder, repo_id, failure_reason(error), path_in_repo) from error


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
