"""Run the client snippets of docs/clients.md and compare their vectors with sentence-transformers'.

    python check_clients.py FOLDERS [--docs docs/clients.md] [--clients langchain,llamaindex,...]

FOLDERS is what scripts/clients/make_folders.py wrote (mote, mpnet-mote, moe, their -onnx exports,
expected.json). Each
```python block of the page that follows a `<!-- client: NAME | package: DIST | call: CALL -->` line is run
as written, once per folder, with its `MODEL = ...` line pointing at the folder (`...-onnx` at the ONNX export)
and its `QUERIES = ...` / `DOCUMENTS = ...` lines at the texts of expected.json. The snippet leaves `queries`
and `documents` (lists of vectors), which must agree with `encode_query(QUERIES)` / `encode_document(DOCUMENTS)`
on the same folder: 1 - cosine <= 1e-4 per row. On the MoTE folders the experts differ, so a query routed to any
other expert than the query expert (or a document to any but the document expert) is far off (see the wrong-route
distances expected.json records).

Run it from outside the repository, in a clients' environment: the folders carry their own code, and this
package must not be importable. Prints one line per client and exits 1 if any failed.
"""

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# this script's own folder (inside the repository) is not a place to import from
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
MARKER = re.compile(r"^<!-- client: (?P<name>[\w-]+) \| package: (?P<package>[\w.-]+) \| call: (?P<call>.+?) -->\s*$")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
TOLERANCE = 1e-4


def snippets(text: str) -> list[dict]:
    """The page's client blocks: name, package, call and code, in page order."""
    found = []
    for match in BLOCK.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.match(before)
        if marker and match.group(1) == "python":
            found.append({**marker.groupdict(), "code": match.group(2)})
    return found


def substitute(code: str, model: str, queries: list[str], documents: list[str]) -> str:
    """The snippet with its MODEL, QUERIES and DOCUMENTS lines set; each must be there exactly once."""
    for name, value in (("MODEL", model), ("QUERIES", queries), ("DOCUMENTS", documents)):
        code, count = re.subn(rf"^{name} = .*$", lambda _, n=name, v=value: f"{n} = {v!r}", code, flags=re.M)
        if count != 1:
            raise ValueError(f"the snippet must set {name} on one line of its own (found {count})")
    return code


def one_minus_cos(got, want) -> np.ndarray:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"vectors of shape {got.shape}, expected {want.shape}")
    return 1 - (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


# a fresh interpreter per run, as a user runs a snippet: clients keep process-wide state (Chroma's in-memory
# client, fastembed's model registry, cached models) that a second folder in the same process would meet
RUNNER = """
import json, sys
import numpy as np
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
code = open(sys.argv[1]).read()
scope = {"__name__": "__main__"}
exec(compile(code, sys.argv[2], "exec"), scope)
vectors = {k: np.asarray([np.asarray(v, dtype=np.float64) for v in scope[k]]).tolist()
           for k in ("queries", "documents")}
print("VECTORS " + json.dumps(vectors))
"""


def run_snippet(code: str, name: str) -> dict:
    """`queries` and `documents` as the snippet leaves them, run in a fresh interpreter of this environment."""
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / f"{name}.py"
        path.write_text(code)
        done = subprocess.run(
            [sys.executable, "-c", RUNNER, str(path), f"docs/clients.md [{name}]"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("VECTORS ")]
    if done.returncode != 0 or not lines:
        error = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["no output"]
        raise RuntimeError(f"exit {done.returncode}: {error[0]}")
    return json.loads(lines[-1].removeprefix("VECTORS "))


def model_path(code: str, folders: Path, family: str) -> str:
    documented = re.search(r'^MODEL = "(?P<path>[^"]+)"', code, flags=re.M)
    onnx = documented is not None and documented.group("path").endswith("-onnx")
    return str(folders / (f"{family}-onnx" if onnx else family))


def check(snippet: dict, folders: Path, expected: dict) -> tuple[bool, str]:
    """Run one client's snippet on each folder; (passed, what to print after the client's name)."""
    worst, problems = {}, []
    for family, want in expected["folders"].items():
        try:
            code = substitute(
                snippet["code"],
                model_path(snippet["code"], folders, family),
                expected["queries_text"],
                expected["documents_text"],
            )
            got = run_snippet(code, snippet["name"])
            distance = max(
                one_minus_cos(got["queries"], want["queries"]).max(),
                one_minus_cos(got["documents"], want["documents"]).max(),
            )
            worst[family] = float(distance)
            if not distance <= TOLERANCE:
                problems.append(f"{family}: max 1-cos {distance:.2e} > {TOLERANCE:g} (a wrong expert?)")
        except Exception as error:  # noqa: BLE001 - any failure of a client is reported as that client's
            problems.append(f"{family}: {error}")
    try:
        version = importlib.metadata.version(snippet["package"])
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    distances = " ".join(f"{family}={value:.1e}" for family, value in worst.items())
    line = f"{snippet['package']}=={version} | {snippet['call']} | max(1-cos) {distances or '-'}"
    return not problems, line + "".join(f"\n    FAIL {p}" for p in problems)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path)
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--clients", help="comma-separated client names (default: all on the page)")
    args = parser.parse_args(argv)

    for name in ("modeling", "moe_embed", "convert"):
        try:
            __import__(name)
        except ImportError:
            continue
        print(f"FAIL: {name} is importable here; run from outside the repository, without moe-embed installed")
        return 1
    expected = json.loads((args.folders / "expected.json").read_text())
    found = snippets(args.docs.read_text(encoding="utf-8"))
    wanted = args.clients.split(",") if args.clients else [s["name"] for s in found]
    missing = sorted(set(wanted) - {s["name"] for s in found})
    if missing:
        print(f"FAIL: no snippet in {args.docs} for {', '.join(missing)}")
        return 1
    for family, entry in expected["folders"].items():
        wrong = entry.get("wrong_routes", {})
        if wrong and min(wrong.values()) <= 100 * TOLERANCE:
            print(f"FAIL: the {family} folder's experts are too close for a wrong route to show: {wrong}")
            return 1
    failed = 0
    for snippet in found:
        if snippet["name"] not in wanted:
            continue
        passed, line = check(snippet, args.folders, expected)
        failed += not passed
        print(f"{'ok  ' if passed else 'FAIL'} {snippet['name']:<10} {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
