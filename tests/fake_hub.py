"""A fake `HfApi` for the tests (no machine here reaches the Hub): it records every call."""

import os

from helpers import hub_http


__all__ = ["FakeHubApi"]


class FakeHubApi:
    """Records every call; the first `fail_uploads` uploads (and `fail_repos` repo creations) raise `error`."""

    def __init__(self, fail_uploads=0, fail_repos=0, error=None):
        self.calls = []
        self.fail_uploads, self.fail_repos = fail_uploads, fail_repos
        self.error = error or hub_http.ConnectError("[Errno 111] Connection refused")

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        self.calls.append(("create_repo", repo_id, private))
        if self.fail_repos:
            self.fail_repos -= 1
            raise self.error
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None, revision=None):
        files = {name: open(os.path.join(folder_path, name), "rb").read() for name in sorted(os.listdir(folder_path))}
        self.calls.append(("upload_folder", repo_id, path_in_repo, files))
        if self.fail_uploads:
            self.fail_uploads -= 1
            raise self.error
        return "commit-sha"
