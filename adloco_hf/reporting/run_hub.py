"""`RunHub`: a run's uploads to the Hub, aimed at the merged model. Checkpoints hold per-worker resume state and
stay local; merges and the merged model go to the Hub, all through `hub.get_hub_api` (`hub.py`).

A part of `AdLoCoTrainer`, handed what it reads as a `run_cards.RunView` and the run's cards (an upload rewrites
the merged card to load from the repo).
"""

import logging
import os
from collections.abc import Callable

from ..common.distributed import all_gather_rows
from .hub import HubUploadError, create_hub_repo, failure_reason, hub_repo_id, push_folder, push_run_folder
from .model_card import full_folder_of
from .run_cards import RunCards, RunView


__all__ = ["RunHub", "create_run_repo"]

logger = logging.getLogger(__name__)


class RunHub:
    """The Hub uploads of one run (module docstring).

    Args:
        run: what the uploads read of the trainer and worker.
        cards: the run's cards.
        hub_model_id: the repo id the Trainer resolved at init (None: from the config when needed).
    """

    def __init__(self, run: RunView, cards: RunCards, hub_model_id: Callable[[], str | None]):
        self.run = run
        self.cards = cards
        self.hub_model_id = hub_model_id
        self.error: HubUploadError | None = None  # the end-of-training upload's, raised once train() returns

    def repo_id(self) -> str:
        return hub_repo_id(self.hub_model_id() or self.run.args.hub_model_id, self.run.args.output_dir)

    def location(self, folder: str) -> tuple[str, str | None] | None:
        """(repo id, folder in the repo) a folder of this run goes to with `push_to_hub=True` (for its card)."""
        args = self.run.args
        if not args.push_to_hub:
            return None
        relative = os.path.relpath(os.path.abspath(folder), os.path.abspath(args.output_dir))
        if relative not in ("merged", "merged-full") and os.path.dirname(relative) != "merges":
            return None
        return self.repo_id(), None if relative == "merged" else relative.replace(os.sep, "/")

    def push_merged(
        self,
        folder: str,
        repo_id: str | None,
        *,
        commit_message: str,
        token: str | None,
        private: bool | None,
        revision: str | None,
    ):
        """Upload the merged `folder` (and with `save_merged_full` its `-full` twin, to the repo's `merged-full/`)
        from global rank 0 (collective: every rank learns whether it failed, and raises alike).

        Raises:
            HubUploadError: on every rank, when the upload failed after `PUSH_ATTEMPTS` tries; it names the local
                folder that holds the model and the repo.
        """
        result, error = None, None
        if self.run.is_writer():
            try:
                result = self._push(folder, repo_id, commit_message, token, private, revision)
            except HubUploadError as failed:
                error = failed
        # Every rank learns whether rank 0's upload failed, so all of them raise (none waits for the others).
        if any(row[0] for row in all_gather_rows([error is not None], self.run.args.device)):
            raise error or HubUploadError(folder, self.hub_model_id() or "the run's repo", "global rank 0 failed")
        return result

    def _push(self, folder, repo_id, commit_message, token, private, revision):
        args = self.run.args
        target = repo_id or self.repo_id()
        token = token if token is not None else args.hub_token
        private = private if private is not None else args.hub_private_repo
        try:
            target = create_hub_repo(target, token=token, private=private)
        except Exception as cause:  # noqa: BLE001 - one error type for every way an upload can fail
            raise HubUploadError(folder, target, failure_reason(cause)) from cause
        self.cards.write_merged(folder, repo_id=target)  # the card's snippet now loads from the repo
        full = full_folder_of(folder) if args.save_merged_full else None
        result = None
        for source, path_in_repo in ((folder, None), (full, "merged-full")):
            if source is not None and os.path.isdir(source):
                uploaded = push_folder(
                    source,
                    repo_id=target,
                    path_in_repo=path_in_repo,
                    commit_message=commit_message,
                    token=token,
                    revision=revision if revision is not None else args.hub_revision,
                    ensure_repo=False,
                )
                result = uploaded if path_in_repo is None else result
        return result

    def push_during_training(self, folder: str, *, path_in_repo: str, commit_message: str) -> bool:
        """Upload a merge while training goes on: after `PUSH_ATTEMPTS` failed tries it is logged at WARNING and
        training continues (the folder is on disk). Returns whether it was uploaded."""
        try:
            push_run_folder(
                folder,
                self.run.args,
                hub_model_id=self.hub_model_id(),
                path_in_repo=path_in_repo,
                commit_message=commit_message,
            )
            return True
        except HubUploadError as error:
            logger.warning("%s Training goes on.", error)
            return False


def create_run_repo(args, token: str | None = None, private: bool | None = None) -> str:
    """Create a run's repo (`hub_model_id`, or one named after `output_dir`) through the same Hub client as every
    other upload; returns its id. A Hub out of reach does not stop training: a WARNING is logged and the repo is
    created at the first upload. (Called by the Trainer's own `__init__`, before the run's parts exist.)"""
    repo_id = hub_repo_id(args.hub_model_id, args.output_dir)
    try:
        return create_hub_repo(
            repo_id,
            token=token if token is not None else args.hub_token,
            private=private if private is not None else args.hub_private_repo,
        )
    except Exception as error:  # noqa: BLE001 - the run can train without the Hub; uploads try again later
        logger.warning(
            "could not create the Hub repo %s (%s: %s); training goes on and every upload tries again",
            repo_id, type(error).__name__, error,
        )  # fmt: skip
        return repo_id
