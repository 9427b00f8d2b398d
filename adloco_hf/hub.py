"""Hub uploads: the repo id a run pushes to and one client for every upload (merges and the merged model)."""

import os

from .distributed import barrier


__all__ = ["MergedModelHubMixin", "create_hub_repo", "get_hub_api", "hub_repo_id", "push_folder", "push_run_folder"]


def hub_repo_id(hub_model_id: str | None, output_dir: str) -> str:
    """The repo a run pushes to: `hub_model_id`, else the name of its output folder (the Trainer's own fallback)."""
    return hub_model_id or os.path.basename(os.path.abspath(output_dir))


def get_hub_api(token: str | None = None):
    """The `huggingface_hub.HfApi` used for every upload (tests replace this function with a recording fake)."""
    from huggingface_hub import HfApi

    return HfApi(token=token)


def create_hub_repo(repo_id: str, *, token: str | None = None, private: bool | None = None) -> str:
    """Create the repo if needed; returns its full id (namespace/name)."""
    return get_hub_api(token).create_repo(repo_id, private=private, exist_ok=True).repo_id


def push_folder(
    folder: str,
    *,
    repo_id: str,
    path_in_repo: str | None = None,
    commit_message: str,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
):
    """Create the repo if needed and upload `folder` to it (to `path_in_repo`, the root by default)."""
    repo_id = create_hub_repo(repo_id, token=token, private=private)
    return get_hub_api(token).upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        path_in_repo=path_in_repo,
        commit_message=commit_message,
        revision=revision,
    )


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


class MergedModelHubMixin:
    """The Trainer's Hub methods, aimed at the merged model (mixed into `AdLoCoTrainer` before `Trainer`).

    Checkpoints hold per-worker resume state and stay local; merges and the merged model go to the Hub, all through
    `get_hub_api`. Needs the Trainer's `args`, `hub_model_id`, `is_world_process_zero` and AdLoCo's
    `save_merged_model` and `worker`.
    """

    def push_merged_to_hub(
        self,
        repo_id: str | None = None,
        *,
        commit_message: str = "AdLoCo merged model",
        token: str | None = None,
        private: bool | None = None,
        revision: str | None = None,
    ):
        """Upload `{output_dir}/merged/` (saved first if missing) to the Hub from global rank 0 (collective)."""
        folder = os.path.join(self.args.output_dir, "merged")
        if not os.path.isdir(folder) or not self.worker.final_merged:
            self.save_merged_model(folder)
        result = None
        if self.is_world_process_zero():
            result = push_run_folder(
                folder,
                self.args,
                hub_model_id=self.hub_model_id,
                commit_message=commit_message,
                repo_id=repo_id,
                token=token,
                private=private,
                revision=revision,
            )
        barrier()
        return result

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
        """Create the repo through the same Hub client as every other upload of this trainer."""
        if not self.is_world_process_zero():
            return
        self.hub_model_id = create_hub_repo(
            hub_repo_id(self.args.hub_model_id, self.args.output_dir),
            token=token if token is not None else self.args.hub_token,
            private=private if private is not None else self.args.hub_private_repo,
        )
        self.push_in_progress = None

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Checkpoints hold per-worker resume state and stay local; merges and the merged model go to the Hub."""
