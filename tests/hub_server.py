"""A stand-in for the Hugging Face Hub's HTTP API, enough for `create_repo`, `create_branch` and
`create_commit` (preupload, LFS batch + PUT, NDJSON commit) from `huggingface_hub`. Runs on
127.0.0.1 in a thread; records what it was sent. For tests only."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


@dataclass
class HubState:
    repos: dict[str, dict] = field(default_factory=dict)  # repo_id -> {"private": bool, "branches": set}
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo_id -> path -> content
    lfs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content
    commits: list[dict] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # "METHOD path"
    authorizations: list[str] = field(default_factory=list)
    validated_cards: list = field(default_factory=list)  # card metadata the server parsed


class _Handler(BaseHTTPRequestHandler):
    state: HubState
    base_url: str

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload=None) -> None:
        data = json.dumps(payload if payload is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        self.state.requests.append(f"{self.command} {self.path.split('?')[0]}")
        if self.headers.get("Authorization"):
            self.state.authorizations.append(self.headers["Authorization"])

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        path = self.path.split("?")[0]
        body = self._body()
        if path == "/api/repos/create":
            request = json.loads(body)
            repo_id = f"{request.get('organization') or 'user'}/{request['name']}"
            exists = repo_id in self.state.repos
            private = bool(request.get("private")) or request.get("visibility") == "private"
            self.state.repos.setdefault(repo_id, {"private": private, "branches": {"main"}})
            self.state.files.setdefault(repo_id, {})
            return self._send(409 if exists else 200, {"url": f"{self.base_url}/{repo_id}", "name": repo_id})
        if path == "/api/validate-yaml":  # the Hub parses the model card's metadata before a commit
            content = json.loads(body)["content"]
            parts = content.split("---")
            try:
                metadata = yaml.safe_load(parts[1]) if content.startswith("---") and len(parts) > 2 else None
            except yaml.YAMLError as error:
                return self._send(400, {"error": f"invalid YAML: {error}"})
            self.state.validated_cards.append(metadata)
            return self._send(200, {"warnings": [] if metadata else [{"message": "empty metadata"}]})
        if match := re.fullmatch(r"/api/models/(.+?)/preupload/(.+)", path):
            files = json.loads(body)["files"]
            return self._send(
                200,
                {
                    "files": [
                        {
                            "path": f["path"],
                            "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular",
                            "shouldIgnore": False,
                        }
                        for f in files
                    ]
                },
            )
        if match := re.fullmatch(r"/(.+?)\.git/info/lfs/objects/batch", path):
            objects = json.loads(body)["objects"]
            return self._send(
                200,
                {
                    "transfer": "basic",
                    "objects": [
                        {
                            "oid": o["oid"],
                            "size": o["size"],
                            "actions": {"upload": {"href": f"{self.base_url}/lfs-upload/{o['oid']}"}},
                        }
                        for o in objects
                    ],
                },
            )
        if match := re.fullmatch(r"/api/models/(.+?)/commit/(.+)", path):
            repo_id, revision = match.group(1), match.group(2)
            if repo_id not in self.state.repos:
                return self._send(404, {"error": "Repository not found"})
            commit = {"repo_id": repo_id, "revision": revision, "files": []}
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "header":
                    commit["summary"] = item["value"].get("summary")
                elif item["key"] == "file":
                    content = base64.b64decode(item["value"]["content"])
                    self.state.files[repo_id][item["value"]["path"]] = content
                    commit["files"].append(item["value"]["path"])
                elif item["key"] == "lfsFile":
                    self.state.files[repo_id][item["value"]["path"]] = self.state.lfs[item["value"]["oid"]]
                    commit["files"].append(item["value"]["path"])
            self.state.commits.append(commit)
            return self._send(
                200,
                {
                    "commitUrl": f"{self.base_url}/{repo_id}/commit/abc",
                    "commitOid": "a" * 40,
                    "commitMessage": commit.get("summary"),
                    "success": True,
                },
            )
        if match := re.fullmatch(r"/api/models/(.+?)/branch/(.+)", path):
            self.state.repos[match.group(1)]["branches"].add(match.group(2))
            return self._send(200, {})
        return self._send(404, {"error": f"not handled: POST {path}"})

    def do_PUT(self) -> None:  # noqa: N802
        self._record()
        path = self.path.split("?")[0]
        if match := re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", path):
            data = self._body()
            if hashlib.sha256(data).hexdigest() != match.group(1):
                return self._send(400, {"error": "sha256 mismatch"})
            self.state.lfs[match.group(1)] = data
            return self._send(200, {})
        return self._send(404, {"error": f"not handled: PUT {path}"})

    def do_GET(self) -> None:  # noqa: N802
        self._record()
        return self._send(404, {"error": f"not handled: GET {self.path}"})


class FakeHub:
    """`with FakeHub() as hub:` serves on `hub.url` until the block ends; `hub.state` records requests."""

    def __init__(self) -> None:
        self.state = HubState()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        handler.base_url = self.url
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
