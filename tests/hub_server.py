"""A Hugging Face Hub on 127.0.0.1 for tests: the part of the Hub's HTTP API that huggingface_hub 2.4.0 uses to create
a model repo, commit to it (inline files and Git LFS), look it up and download from it; and a server that accepts
connections and never answers.

Written against the client's own code (hf_api, _commit_api, lfs, file_download, _snapshot_download and
utils._http.hf_raise_for_status, which reads the X-Error-Code / X-Error-Message headers): the URLs, the payloads,
the headers and the error answers are those the client sends and reads. As on the Hub, a repo that does not exist
and a private one the caller may not read get the same answer (401 without a token, 404 with one), a new repo starts
with an "initial commit" of its .gitattributes, whose LFS patterns decide what preupload calls "lfs", and an LFS
file's resolve answers with a redirect to a storage host of its own (another port, so another origin, as S3 is),
carrying X-Linked-Etag and X-Linked-Size. Commit ids are SHA-1s of the commit's tree, parent, author, time and
message; blob ids are git's own (`sha1("blob <size>\\0" + content)`).

Dataset repos too, as 🤗 datasets 5.2.0 writes (`Dataset.push_to_hub`) and reads (`load_dataset`, through
HfFileSystem) them: the same routes under /api/datasets/..., resolve under /datasets/..., and paths-info. The server
keeps a dataset repo under the key `datasets/OWNER/NAME` (its path on the Hub) in `repos`, beside the model repos.

Not served: Xet storage (its CAS protocol); a push goes through LFS when HF_HUB_DISABLE_XET is set, which
`point_client_at` and the subprocess environments of the tests set. Nor pull requests, organisations, gated repos.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import PurePosixPath
from urllib.parse import parse_qs, quote, unquote, urlsplit

import yaml

DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in ("*.7z", "*.bin", "*.ckpt", "*.gz", "*.h5", "*.npy", "*.npz", "*.onnx", "*.pkl", "*.pt", "*.pth",
                    "*.safetensors", "*.tar", "*.zip")
)
"""What the Hub writes into a new model repo (a subset of its list): the files it stores with Git LFS."""

DATASET_GITATTRIBUTES = DEFAULT_GITATTRIBUTES + "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in ("*.arrow", "*.parquet", "*.jpg", "*.png"))
"""What the Hub writes into a new dataset repo (a subset): also Arrow, Parquet and images with LFS. 🤗 datasets
relies on it: it uploads a shard's parquet from a temporary file that is gone by the commit, where only LFS content
is already uploaded."""

WRITE_TOKEN, READ_TOKEN, OTHER_TOKEN = "hf_someone_write", "hf_someone_read", "hf_other_write"
USER = "someone"
TOKENS = {WRITE_TOKEN: USER, READ_TOKEN: USER, OTHER_TOKEN: "other"}
"""The tokens the `loopback_hub` fixture's Hub knows: someone's (write and read-only) and another user's."""

LFS_THRESHOLD_BYTES = 10 * 1024 * 1024
"""The Hub stores a file this large with LFS whatever its name."""

PIPELINE_TAGS = {"feature-extraction", "image-classification", "image-feature-extraction", "image-to-image",
                 "image-segmentation", "object-detection", "zero-shot-image-classification", "text-classification"}
"""Task ids the front matter's `pipeline_tag` may name (the Hub's list is longer; these are the image ones)."""

DATASETS = "datasets/"
"""The key prefix of a dataset repo in `LoopbackHub.repos`, as its Hub URL path starts."""

MISSING_METADATA_WARNING = ("empty or missing yaml metadata in repo card "
                            "(https://huggingface.co/docs/hub/model-cards#model-card-metadata)")

YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")
"""The Hub's own pattern for a card's front matter (huggingface_hub.repocard.REGEX_YAML_BLOCK copies it)."""


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class Blob:
    """A file at a commit: `content` is what git stores (the file, or its LFS pointer)."""

    content: bytes
    lfs_sha256: str | None = None
    lfs_size: int | None = None

    @property
    def oid(self) -> str:
        return git_blob_id(self.content)

    @property
    def size(self) -> int:
        return self.lfs_size if self.lfs_sha256 else len(self.content)


@dataclass
class Commit:
    oid: str
    parent: str | None
    author: str
    title: str
    date: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_id: str
    private: bool
    created_at: str
    refs: dict[str, str] = field(default_factory=dict)  # branches and tags -> commit oid
    commits: dict[str, Commit] = field(default_factory=dict)

    @property
    def owner(self) -> str:
        return self.repo_id.removeprefix(DATASETS).split("/")[0]

    def resolve(self, revision: str) -> Commit | None:
        oid = self.refs.get(revision) or (revision if revision in self.commits else None)
        return self.commits.get(oid) if oid else None


class HubAnswer(Exception):
    """An error answer: status, JSON body {"error": message}, and X-Error-Code / X-Error-Message as the Hub sends."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None,
                 body: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or {}
        self.body = body if body is not None else {"error": message}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LoopbackHub:
    """The Hub on two loopback ports: `url` (the API, git-LFS batch and resolve) and `storage_url` (LFS objects).

    `tokens` maps each token to its user; tokens in `read_only` may read but not write. Tests read and arrange the
    state directly: `repos`, `lfs_objects` (sha256 -> bytes), `requests` (every (method, path) received, in order),
    `authorizations` (each request's Authorization header, in the same order),
    `add_commit`, `tag`, `files_at`, and `fail` (answer a request with an error status instead).
    """

    def __init__(self, tokens: dict[str, str] | None = None, read_only: tuple[str, ...] = (),
                 tree_page_size: int = 1000):
        self.tokens = dict(tokens or {})
        self.read_only = set(read_only)
        self.tree_page_size = tree_page_size
        self.repos: dict[str, Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header (None: none), in order
        self.faults: list[tuple[str, re.Pattern, int]] = []
        self.server_errors: list[str] = []  # requests this server could not handle: a test fixture fails on them
        self._lock = threading.RLock()
        self._clock = 0
        self._connections: set[socket.socket] = set()
        self._api = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "api"))
        self._storage = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "storage"))
        self._threads = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._api.server_address[1]}"

    @property
    def storage_url(self) -> str:
        return f"http://127.0.0.1:{self._storage.server_address[1]}"

    def start(self) -> LoopbackHub:
        for server in (self._api, self._storage):
            server.daemon_threads = True
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        for server in (self._api, self._storage):
            server.shutdown()
            server.server_close()
        with self._lock:  # kept-alive client connections would hold their handler threads until they time out
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> LoopbackHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ state, for tests
    def create_repo(self, repo_id: str, private: bool = False) -> Repo:
        """A new repo with the Hub's initial commit (.gitattributes)."""
        with self._lock:
            repo = Repo(repo_id, private, _now())
            self.repos[repo_id] = repo
            attributes = DATASET_GITATTRIBUTES if repo_id.startswith(DATASETS) else DEFAULT_GITATTRIBUTES
            self._commit(repo, "main", repo.owner, "initial commit", {".gitattributes": Blob(attributes.encode())})
            return repo

    def add_commit(self, repo_id: str, files: dict[str, bytes], message: str = "add files",
                   branch: str = "main") -> str:
        """Commit `files` to `branch` (created from main if new) as the owner would; stored with LFS where the
        repo's .gitattributes say; the new commit's id."""
        with self._lock:
            repo = self.repos.get(repo_id) or self.create_repo(repo_id)
            base = repo.resolve(branch) or repo.resolve("main")
            blobs = {}
            for path, content in files.items():
                if self._is_lfs(base, path, len(content)):
                    sha256 = hashlib.sha256(content).hexdigest()
                    self.lfs_objects[sha256] = content
                    blobs[path] = Blob(lfs_pointer(sha256, len(content)), sha256, len(content))
                else:
                    blobs[path] = Blob(content)
            repo.refs.setdefault(branch, base.oid)
            return self._commit(repo, branch, repo.owner, message, {**base.files, **blobs}).oid

    def tag(self, repo_id: str, name: str, revision: str = "main") -> None:
        with self._lock:
            repo = self.repos[repo_id]
            repo.refs[name] = repo.resolve(revision).oid

    def files_at(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The repo's files at `revision`, LFS ones with their content."""
        with self._lock:
            commit = self.repos[repo_id].resolve(revision)
            return {path: self.lfs_objects[blob.lfs_sha256] if blob.lfs_sha256 else blob.content
                    for path, blob in commit.files.items()}

    def fail(self, method: str, path_pattern: str, status: int) -> None:
        """Answer requests of `method` whose path matches `path_pattern` (re.search) with `status` from now on."""
        with self._lock:
            self.faults.append((method, re.compile(path_pattern), status))

    def paths_requested(self, method: str | None = None) -> list[str]:
        """The paths (without query) requested so far, in order, of `method` or of any."""
        with self._lock:
            return [urlsplit(path).path for asked, path in self.requests if method in (None, asked)]

    # ------------------------------------------------------------------ internals
    def _commit(self, repo: Repo, branch: str, author: str, title: str, files: dict[str, Blob]) -> Commit:
        parent = repo.refs.get(branch)
        self._clock += 1
        tree = hashlib.sha1("".join(f"{path}\0{blob.oid}\n" for path, blob in sorted(files.items())).encode())
        header = f"tree {tree.hexdigest()}\nparent {parent}\nauthor {author} {self._clock}\n\n{title}\n"
        commit = Commit(hashlib.sha1(header.encode()).hexdigest(), parent, author, title, _now(), dict(files))
        repo.commits[commit.oid] = commit
        repo.refs[branch] = commit.oid
        return commit

    @staticmethod
    def _is_lfs(commit: Commit, path: str, size: int) -> bool:
        attributes = commit.files.get(".gitattributes")
        patterns = [line.split()[0] for line in (attributes.content.decode().splitlines() if attributes else [])
                    if "filter=lfs" in line.split()[1:]]
        name = PurePosixPath(path).name
        return size > LFS_THRESHOLD_BYTES or any(
            fnmatch.fnmatchcase(path if "/" in pattern else name, pattern) for pattern in patterns)

    def _user(self, request: _Request, required: bool = False) -> str | None:
        authorization = request.headers.get("authorization") or ""
        if not authorization:
            if required:
                raise HubAnswer(401, "Invalid username or password.")
            return None
        token = authorization.removeprefix("Bearer ").strip()
        if token not in self.tokens:
            raise HubAnswer(401, "Invalid credentials in Authorization header")
        return self.tokens[token]

    def _readable_repo(self, request: _Request, repo_id: str) -> Repo:
        user = self._user(request)
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and user != repo.owner):  # the Hub does not tell which
            if user is None:
                raise HubAnswer(401, "Invalid username or password.", "RepoNotFound")
            raise HubAnswer(404, "Repository not found", "RepoNotFound")
        return repo

    def _writable_repo(self, request: _Request, repo_id: str) -> tuple[Repo, str]:
        repo = self._readable_repo(request, repo_id)
        user = self._user(request, required=True)
        token = request.headers["authorization"].removeprefix("Bearer ").strip()
        if user != repo.owner:
            raise HubAnswer(403, f"You don't have the rights to write to {repo_id}")
        if token in self.read_only:
            raise HubAnswer(403, "This token has no write access: use a token with the write role")
        return repo, user

    @staticmethod
    def _commit_at(repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubAnswer(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def _card_metadata(self, commit: Commit) -> dict | None:
        card = commit.files.get("README.md")
        if card is None:
            return None
        match = YAML_BLOCK.search(card.content.decode("utf-8", errors="replace"))
        try:
            metadata = yaml.safe_load(match.group(2)) if match else None
        except yaml.YAMLError:
            return None
        return metadata if isinstance(metadata, dict) else None

    # ------------------------------------------------------------------ routes
    def route(self, request: _Request) -> _Response:
        with self._lock:
            self.requests.append((request.method, request.target))
            self.authorizations.append(request.headers.get("authorization"))
            for method, pattern, status in self.faults:
                if method == request.method and pattern.search(request.path):
                    raise HubAnswer(status, f"{status} (a failure this test asked for)")
        if request.server == "storage":
            return self._storage_route(request)
        parts = [unquote(part) for part in request.path.strip("/").split("/")]
        method = request.method
        with self._lock:
            if method == "POST" and parts == ["api", "repos", "create"]:
                return self._create(request)
            if method == "POST" and parts == ["api", "validate-yaml"]:
                return _json(validate_card_yaml(request.json().get("content", "")))
            if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
                return self._dataset_route(request, DATASETS + "/".join(parts[2:4]), parts[4:])
            if parts[0] == "datasets" and len(parts) >= 6 and parts[3] == "resolve" and method in ("GET", "HEAD"):
                return self._resolve(request, "/".join(parts[:3]), parts[4], "/".join(parts[5:]))
            if (parts[0] == "datasets" and len(parts) == 7 and parts[2].endswith(".git")
                    and parts[3:6] == ["info", "lfs", "objects"] and method == "POST"):
                repo_id = f"{DATASETS}{parts[1]}/{parts[2].removesuffix('.git')}"
                return (self._lfs_batch if parts[6] == "batch" else self._lfs_verify)(request, repo_id)
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id, rest = "/".join(parts[2:4]), parts[4:]
                if method == "GET" and not rest:
                    return self._info(request, repo_id, "main")
                if method == "GET" and len(rest) == 2 and rest[0] == "revision":
                    return self._info(request, repo_id, rest[1])
                if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
                    return self._tree(request, repo_id, rest[1], "/".join(rest[2:]))
                if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                    return self._preupload(request, repo_id, rest[1])
                if method == "POST" and len(rest) == 2 and rest[0] == "commit":
                    return self._receive_commit(request, repo_id, rest[1])
            if len(parts) == 6 and parts[1].endswith(".git") and parts[2:5] == ["info", "lfs", "objects"]:
                repo_id = f"{parts[0]}/{parts[1].removesuffix('.git')}"
                if method == "POST" and parts[5] == "batch":
                    return self._lfs_batch(request, repo_id)
                if method == "POST" and parts[5] == "verify":
                    return self._lfs_verify(request, repo_id)
            if method in ("GET", "HEAD") and len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(request, "/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        raise HubAnswer(404, "Sorry, we can't find the page you are looking for.")

    def _create(self, request: _Request) -> _Response:
        user = self._user(request, required=True)
        payload = request.json()
        namespace = payload.get("organization") or user
        repo_id = f"{namespace}/{payload['name']}"
        if payload.get("type", "model") not in ("model", "dataset"):
            raise HubAnswer(400, "this test Hub holds model and dataset repos only")
        if payload.get("type") == "dataset":
            repo_id = DATASETS + repo_id
        if namespace != user:
            raise HubAnswer(403, f'You don\'t have the rights to create a model under the namespace "{namespace}"')
        token = request.headers["authorization"].removeprefix("Bearer ").strip()
        if token in self.read_only:
            raise HubAnswer(403, "This token has no write access: use a token with the write role")
        url = f"{self.url}/{repo_id}"
        if repo_id in self.repos:
            raise HubAnswer(409, "You already created this model repo", body={"error": "You already created this "
                                                                              "model repo", "url": url})
        private = payload.get("visibility") == "private" or payload.get("private") is True
        self.create_repo(repo_id, private=private)
        return _json({"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def _info(self, request: _Request, repo_id: str, revision: str) -> _Response:
        repo = self._readable_repo(request, repo_id)
        commit = self._commit_at(repo, revision)
        card = self._card_metadata(commit) or {}
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
            "author": repo.owner, "sha": commit.oid, "lastModified": commit.date, "createdAt": repo.created_at,
            "private": repo.private, "gated": False, "disabled": False, "downloads": 0, "likes": 0,
            "tags": list(card.get("tags") or []), "library_name": card.get("library_name"),
            "pipeline_tag": card.get("pipeline_tag"),
            "siblings": [{"rfilename": path} for path in sorted(commit.files)],
            "spaces": [], "usedStorage": sum(blob.size for blob in commit.files.values()),
        }
        if card:
            info["cardData"] = card
            if "model-index" in card:
                info["model-index"] = card["model-index"]
        return _json(info)

    def _dataset_route(self, request: _Request, repo_id: str, rest: list[str]) -> _Response:
        """/api/datasets/OWNER/NAME[/...]: the model routes' answers for a dataset repo, and paths-info."""
        method = request.method
        if method == "GET" and not rest:
            return self._dataset_info(request, repo_id, "main")
        if method == "GET" and len(rest) == 2 and rest[0] == "revision":
            return self._dataset_info(request, repo_id, rest[1])
        if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
            return self._tree(request, repo_id, rest[1], "/".join(rest[2:]))
        if method == "POST" and len(rest) == 2 and rest[0] == "paths-info":
            return self._paths_info(request, repo_id, rest[1])
        if method == "POST" and len(rest) == 2 and rest[0] == "branch":
            return self._create_branch(request, repo_id, rest[1])
        if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
            return self._preupload(request, repo_id, rest[1])
        if method == "POST" and len(rest) == 2 and rest[0] == "commit":
            return self._receive_commit(request, repo_id, rest[1])
        raise HubAnswer(404, "Sorry, we can't find the page you are looking for.")

    def _dataset_info(self, request: _Request, repo_id: str, revision: str) -> _Response:
        """huggingface_hub.hf_api.DatasetInfo's fields, as the Hub answers /api/datasets/OWNER/NAME."""
        repo = self._readable_repo(request, repo_id)
        commit = self._commit_at(repo, revision)
        card = self._card_metadata(commit) or {}
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id.removeprefix(DATASETS),
            "author": repo.owner, "sha": commit.oid, "lastModified": commit.date, "createdAt": repo.created_at,
            "private": repo.private, "gated": False, "disabled": False, "downloads": 0, "likes": 0,
            "tags": list(card.get("tags") or []), "siblings": [{"rfilename": path} for path in sorted(commit.files)],
            "usedStorage": sum(blob.size for blob in commit.files.values()),
        }
        if card:
            info["cardData"] = card
        return _json(info)

    def _create_branch(self, request: _Request, repo_id: str, branch: str) -> _Response:
        """A new branch at `startingPoint` (default: main's head); 409 if it exists, as the Hub answers."""
        repo, _ = self._writable_repo(request, repo_id)
        if branch in repo.refs:
            raise HubAnswer(409, f"Reference refs/heads/{branch} already exists")
        repo.refs[branch] = self._commit_at(repo, request.json().get("startingPoint") or "main").oid
        return _json({})

    def _paths_info(self, request: _Request, repo_id: str, revision: str) -> _Response:
        """The entries (files as in a tree listing, folders) of the form-encoded `paths` that exist at `revision`."""
        repo = self._readable_repo(request, repo_id)
        commit = self._commit_at(repo, revision)
        entries = []
        for path in parse_qs(request.body.decode()).get("paths", []):
            path = path.strip("/")
            blob = commit.files.get(path)
            if blob is not None:
                entry = {"type": "file", "oid": blob.oid, "size": blob.size, "path": path}
                if blob.lfs_sha256:
                    entry["lfs"] = {"oid": blob.lfs_sha256, "size": blob.lfs_size, "pointerSize": len(blob.content)}
                entries.append(entry)
            elif any(name.startswith(path + "/") for name in commit.files) or path == "":
                entries.append({"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
                                "path": path})
        return _json(entries)

    def _tree(self, request: _Request, repo_id: str, revision: str, folder: str) -> _Response:
        repo = self._readable_repo(request, repo_id)
        commit = self._commit_at(repo, revision)
        recursive = request.query.get("recursive", ["false"])[0].lower() in ("true", "1")
        prefix = f"{folder}/" if folder else ""
        inside = sorted(path for path in commit.files if path.startswith(prefix))
        if folder and not inside:
            raise HubAnswer(404, f"{folder} does not exist at {revision}", "EntryNotFound")
        entries, folders = [], set()
        for path in inside:
            relative = PurePosixPath(path[len(prefix):])
            if recursive:
                folders.update(prefix + str(parent) for parent in relative.parents if str(parent) != ".")
            elif len(relative.parts) > 1:
                folders.add(prefix + relative.parts[0])
            if recursive or len(relative.parts) == 1:
                blob = commit.files[path]
                entry = {"type": "file", "oid": blob.oid, "size": blob.size, "path": path}
                if blob.lfs_sha256:
                    entry["lfs"] = {"oid": blob.lfs_sha256, "size": blob.lfs_size, "pointerSize": len(blob.content)}
                entries.append(entry)
        entries += [{"type": "directory", "oid": hashlib.sha1(name.encode()).hexdigest(), "size": 0, "path": name}
                    for name in sorted(folders)]
        entries.sort(key=lambda entry: entry["path"])
        start = int(request.query.get("cursor", ["0"])[0])
        page = entries[start:start + self.tree_page_size]
        headers = {}
        if start + self.tree_page_size < len(entries):  # the Hub's cursor pagination, a GitHub-style Link header
            query = {key: values[0] for key, values in request.query.items()} | {"cursor": start + self.tree_page_size}
            next_url = f"{self.url}{request.path}?" + "&".join(f"{key}={quote(str(value))}"
                                                              for key, value in query.items())
            headers["Link"] = f'<{next_url}>; rel="next"'
        return _json(page, headers=headers)

    def _preupload(self, request: _Request, repo_id: str, revision: str) -> _Response:
        repo, _ = self._writable_repo(request, repo_id)
        if request.query.get("create_pr"):
            raise HubAnswer(400, "this test Hub has no pull requests")
        commit = self._commit_at(repo, revision)
        answers = []
        for file in request.json()["files"]:
            mode = "lfs" if self._is_lfs(commit, file["path"], int(file["size"])) else "regular"
            answer = {"path": file["path"], "uploadMode": mode, "shouldIgnore": False}
            existing = commit.files.get(file["path"])
            if existing is not None:  # lets the client skip an unchanged file
                answer["oid"] = existing.lfs_sha256 if existing.lfs_sha256 else existing.oid
            answers.append(answer)
        return _json({"files": answers, "commitOid": commit.oid})

    def _lfs_batch(self, request: _Request, repo_id: str) -> _Response:
        self._writable_repo(request, repo_id)
        payload = request.json()
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            raise HubAnswer(400, "this test Hub takes LFS uploads with the basic transfer only")
        objects = []
        for item in payload["objects"]:
            oid, size = item["oid"], int(item["size"])
            if oid in self.lfs_objects:
                objects.append({"oid": oid, "size": size})  # no actions: already stored
                continue
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                "upload": {"href": f"{self.storage_url}/upload/{oid}?size={size}"},
                "verify": {"href": f"{self.url}/{repo_id}.git/info/lfs/objects/verify",
                           "header": {"Authorization": request.headers["authorization"]}},
            }})
        return _json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                     content_type="application/vnd.git-lfs+json")

    def _lfs_verify(self, request: _Request, repo_id: str) -> _Response:
        self._writable_repo(request, repo_id)
        payload = request.json()
        stored = self.lfs_objects.get(payload["oid"])
        if stored is None or len(stored) != int(payload["size"]):
            raise HubAnswer(404, f"LFS object {payload['oid']} was not uploaded")
        return _json({"success": True})

    def _receive_commit(self, request: _Request, repo_id: str, revision: str) -> _Response:
        repo, user = self._writable_repo(request, repo_id)
        if request.query.get("create_pr"):
            raise HubAnswer(400, "this test Hub has no pull requests")
        if revision not in repo.refs or repo.refs[revision] not in repo.commits:
            raise HubAnswer(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        if not request.headers.get("content-type", "").startswith("application/x-ndjson"):
            raise HubAnswer(400, "a commit is sent as application/x-ndjson")
        lines = [json.loads(line) for line in request.body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubAnswer(400, "a commit starts with its header line")
        header = lines[0]["value"]
        head = repo.resolve(revision)
        if header.get("parentCommit") not in (None, head.oid):
            raise HubAnswer(412, "A commit has happened since. Please refresh and try again.")
        files = dict(head.files)
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            path = value["path"]
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubAnswer(400, f"{path}: inline files are sent base64-encoded")
                files[path] = Blob(base64.b64decode(value["content"]))
            elif key == "lfsFile":
                stored = self.lfs_objects.get(value["oid"])
                if value.get("algo") != "sha256" or stored is None:
                    raise HubAnswer(422, f"{path}: LFS object {value['oid']} was never uploaded")
                files[path] = Blob(lfs_pointer(value["oid"], len(stored)), value["oid"], len(stored))
            elif key == "deletedFile":
                if files.pop(path, None) is None:
                    raise HubAnswer(404, f"{path} does not exist", "EntryNotFound")
            elif key == "deletedFolder":
                files = {name: blob for name, blob in files.items() if not name.startswith(path.rstrip("/") + "/")}
            else:
                raise HubAnswer(400, f"unknown commit operation {key!r}")
        commit = self._commit(repo, revision, user, header["summary"], files)
        return _json({"success": True, "commitOid": commit.oid, "commitUrl": f"{self.url}/{repo_id}/commit/"
                      f"{commit.oid}", "hookOutput": ""})

    def _resolve(self, request: _Request, repo_id: str, revision: str, path: str) -> _Response:
        repo = self._readable_repo(request, repo_id)
        commit = self._commit_at(repo, revision)
        blob = commit.files.get(path)
        if blob is None:
            raise HubAnswer(404, f"Entry not found: {path}", "EntryNotFound", headers={"X-Repo-Commit": commit.oid})
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.oid}"', "Accept-Ranges": "bytes"}
        if blob.lfs_sha256:  # to the storage host, as the Hub redirects to its CDN; the metadata rides the redirect
            headers |= {"Location": f"{self.storage_url}/lfs/{blob.lfs_sha256}", "X-Linked-Etag":
                        f'"{blob.lfs_sha256}"', "X-Linked-Size": str(blob.lfs_size)}
            return _Response(302, b"", headers)
        return _ranged(request, blob.content, headers)

    def _storage_route(self, request: _Request) -> _Response:
        parts = request.path.strip("/").split("/")
        if request.method == "PUT" and len(parts) == 2 and parts[0] == "upload":
            sha256 = parts[1]
            if hashlib.sha256(request.body).hexdigest() != sha256:
                raise HubAnswer(400, "the uploaded bytes do not have the sha256 of the batch request")
            with self._lock:
                self.lfs_objects[sha256] = request.body
            return _Response(200, b"", {"ETag": f'"{sha256}"'})
        if request.method in ("GET", "HEAD") and len(parts) == 2 and parts[0] == "lfs":
            with self._lock:
                content = self.lfs_objects.get(parts[1])
            if content is None:
                raise HubAnswer(404, "NoSuchKey")
            return _ranged(request, content, {"ETag": f'"{parts[1]}"', "Accept-Ranges": "bytes"})
        raise HubAnswer(404, "NoSuchKey")


def validate_card_yaml(content: str) -> dict:
    """The Hub's /api/validate-yaml for a model card: {"errors": [...], "warnings": [...]}, each {"message": ...}.

    Checks what the Hub checks of a model card's front matter: a mapping; the types of the known fields; a known
    `pipeline_tag`; a `model-index` of named entries whose results each have a task type, a dataset type and name,
    and metrics with a type and a value.
    """
    match = YAML_BLOCK.search(content)
    if match is None or not match.group(2).strip():
        return {"errors": [], "warnings": [{"message": MISSING_METADATA_WARNING}]}
    try:
        metadata = yaml.safe_load(match.group(2))
    except yaml.YAMLError as error:
        return {"errors": [{"message": f"Invalid YAML in the metadata: {error}"}], "warnings": []}
    if not isinstance(metadata, dict):
        return {"errors": [{"message": '"value" must be of type object'}], "warnings": []}
    errors = []

    def check(condition: bool, message: str) -> None:
        if not condition:
            errors.append({"message": message})

    def strings(value) -> bool:
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))

    for name in ("library_name", "license", "pipeline_tag"):
        if name in metadata:
            check(isinstance(metadata[name], str), f'"{name}" must be a string')
    for name in ("tags", "datasets", "metrics", "language", "base_model"):
        if name in metadata:
            check(strings(metadata[name]), f'"{name}" must be a string or an array of strings')
    if isinstance(metadata.get("pipeline_tag"), str):
        check(metadata["pipeline_tag"] in PIPELINE_TAGS, f'"pipeline_tag" {metadata["pipeline_tag"]!r} is not a '
              "task the Hub knows")
    if "model-index" in metadata:
        errors += [{"message": message} for message in _model_index_errors(metadata["model-index"])]
    return {"errors": errors, "warnings": []}


def _model_index_errors(model_index) -> list[str]:
    if not isinstance(model_index, list):
        return ['"model-index" must be an array']
    errors = []
    for i, entry in enumerate(model_index):
        where = f'"model-index[{i}]'
        if not isinstance(entry, dict):
            errors.append(f'{where}" must be of type object')
            continue
        if not isinstance(entry.get("name"), str):
            errors.append(f'{where}.name" is required and must be a string')
        results = entry.get("results")
        if not isinstance(results, list):
            errors.append(f'{where}.results" is required and must be an array')
            continue
        for j, result in enumerate(results):
            at = f"{where}.results[{j}]"
            if not isinstance(result, dict):
                errors.append(f'{at}" must be of type object')
                continue
            task, dataset, metrics = result.get("task"), result.get("dataset"), result.get("metrics")
            if not (isinstance(task, dict) and isinstance(task.get("type"), str)):
                errors.append(f'{at}.task.type" is required')
            for key in ("type", "name"):
                if not (isinstance(dataset, dict) and isinstance(dataset.get(key), str)):
                    errors.append(f'{at}.dataset.{key}" is required')
            if not isinstance(metrics, list) or not metrics:
                errors.append(f'{at}.metrics" is required and must be a non-empty array')
                continue
            for k, metric in enumerate(metrics):
                if not (isinstance(metric, dict) and isinstance(metric.get("type"), str)):
                    errors.append(f'{at}.metrics[{k}].type" is required')
                if not (isinstance(metric, dict) and "value" in metric):
                    errors.append(f'{at}.metrics[{k}].value" is required')
    return errors


# ---------------------------------------------------------------------- HTTP plumbing


@dataclass
class _Request:
    server: str
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def json(self):
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as error:
            raise HubAnswer(400, f"the body is not JSON: {error}") from None


@dataclass
class _Response:
    status: int
    body: bytes
    headers: dict[str, str]


def _json(value, headers: dict | None = None, content_type: str = "application/json") -> _Response:
    return _Response(200, json.dumps(value).encode(), {"Content-Type": content_type, **(headers or {})})


def _ranged(request: _Request, content: bytes, headers: dict) -> _Response:
    """`content`, or the part a `Range: bytes=N-` asks for (a resumed download)."""
    wanted = re.fullmatch(r"bytes=(\d+)-", request.headers.get("range", ""))
    if wanted is None:
        return _Response(200, content, {"Content-Type": "application/octet-stream", **headers})
    start = int(wanted.group(1))
    return _Response(206, content[start:], {"Content-Type": "application/octet-stream", **headers,
                                            "Content-Range": f"bytes {start}-{len(content) - 1}/{len(content)}"})


def _handler(hub: LoopbackHub, server: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
        timeout = 30

        def setup(self):
            super().setup()
            with hub._lock:
                hub._connections.add(self.connection)

        def finish(self):
            with hub._lock:
                hub._connections.discard(self.connection)
            super().finish()

        def log_message(self, *args):  # quiet: the tests read `hub.requests` instead
            pass

        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline().strip():  # trailers, then the blank line
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _serve(self):
            request = _Request(server, self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                               self._body())
            try:
                response = hub.route(request)
            except Exception as error:  # a request the server does not understand: answer, and let the test know
                answer = error if isinstance(error, HubAnswer) else HubAnswer(500, f"{type(error).__name__}: {error}")
                if not isinstance(error, HubAnswer):
                    with hub._lock:
                        hub.server_errors.append(f"{self.command} {self.path}: {answer.message}")
                headers = {"Content-Type": "application/json", **answer.headers}
                if answer.code:
                    headers["X-Error-Code"] = answer.code
                headers["X-Error-Message"] = answer.message
                response = _Response(answer.status, json.dumps(answer.body).encode(), headers)
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve

    return Handler


class SilentServer:
    """Accepts connections on 127.0.0.1, reads what is sent, and never answers: a Hub that hangs. `request_lines`
    are the first lines of the requests it was sent ("GET /api/models/... HTTP/1.1")."""

    def __init__(self):
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=32)
        self._socket.settimeout(0.1)
        self._accepted: list[socket.socket] = []
        self.request_lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def start(self) -> SilentServer:
        self._thread.start()
        return self

    def _accept(self):
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._accepted.append(connection)
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket):
        received = b""
        try:
            while b"\r\n" not in received:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                received += chunk
        except OSError:
            return
        with self._lock:
            self.request_lines.append(received.split(b"\r\n")[0].decode("latin-1"))

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()
        with self._lock:
            for connection in self._accepted:
                connection.close()

    def __enter__(self) -> SilentServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def point_client_at(monkeypatch, endpoint: str, home) -> None:
    """Point this process's huggingface_hub at `endpoint`, online, with `home` for its cache and token files.

    huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE and the rest once, at import (tests/conftest.py imports it
    offline), into `huggingface_hub.constants`, which the client reads at each call: so the test sets those. Also as
    the CLI and the app run it (memvir._hub_shims: no telemetry, so no agent-harness look-up), and without Xet,
    which the loopback Hub does not serve (uploads go through LFS). No token unless the test sets HF_TOKEN.
    """
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    for variable in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(variable, raising=False)


def client_environment(endpoint: str, home, token: str | None = None) -> dict[str, str]:
    """The environment variables that point a new process's huggingface_hub at `endpoint` (see `point_client_at`),
    with the telemetry setting left to the program under test."""
    import os

    environment = {name: value for name, value in os.environ.items()
                   if name not in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_DISABLE_TELEMETRY")}
    environment |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_XET": "1", "TQDM_DISABLE": "1"}
    if token:
        environment["HF_TOKEN"] = token
    return environment
