"""The bases beyond BERT. So far: the real all-mpnet-base-v2 that `scripts/fetch_mpnet.py` assembles from the
package index (a `slow` test, on the folder of the `mpnet_path` fixture), and that script's integrity check (on a
tiny fake zip, so that it is tested without the network)."""

import hashlib
import json
import zipfile

import pytest

from moe_embed.errors import UsageError

FAKE_WEIGHTS = b"stands in for model.safetensors"


def fake_zip(path, extra: dict[str, str] | None = None):
    """A zip laid out as the parts' (one `all-mpnet-base-v2/` folder, Windows' desktop.ini included)."""
    members = {
        "all-mpnet-base-v2/modules.json": "[]",
        "all-mpnet-base-v2/model.safetensors": FAKE_WEIGHTS,
        "all-mpnet-base-v2/1_Pooling/config.json": "{}",
        "all-mpnet-base-v2/desktop.ini": "[.ShellClassInfo]",
        **(extra or {}),
    }
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("all-mpnet-base-v2/", "")
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_the_fetch_installs_only_what_checks_out(tmp_path):
    from scripts.fetch_mpnet import folder_checks_out, install_zip, sha256_of

    zip_path = fake_zip(tmp_path / "parts.zip")
    zip_sha, weights_prefix = sha256_of(zip_path), hashlib.sha256(FAKE_WEIGHTS).hexdigest()[:16]
    folder = tmp_path / "cache" / "all-mpnet-base-v2"
    folder.parent.mkdir()
    with pytest.raises(UsageError, match="joined zip's sha256"):
        install_zip(zip_path, folder, zip_sha256="0" * 64, weights_prefix=weights_prefix)
    with pytest.raises(UsageError, match="model.safetensors"):
        install_zip(zip_path, folder, zip_sha256=zip_sha, weights_prefix="0" * 16)
    escaping = fake_zip(tmp_path / "escaping.zip", {"all-mpnet-base-v2/../../outside": "x"})
    with pytest.raises(UsageError, match="outside"):
        install_zip(escaping, folder, zip_sha256=sha256_of(escaping), weights_prefix=weights_prefix)
    assert list(folder.parent.iterdir()) == []  # no folder, no staging copy left behind

    assert install_zip(zip_path, folder, zip_sha256=zip_sha, weights_prefix=weights_prefix) == folder
    files = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    assert files == ["1_Pooling/config.json", "model.safetensors", "modules.json"]
    assert folder_checks_out(folder, weights_prefix) and not folder_checks_out(folder)
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]


@pytest.mark.slow
def test_all_mpnet_base_v2_loads_offline_and_embeds(mpnet_path):
    import os

    import torch
    from sentence_transformers import SentenceTransformer

    assert os.environ["HF_HUB_OFFLINE"] == "1"  # set by conftest: nothing may come from the Hub
    assert json.loads((mpnet_path / "config.json").read_text())["model_type"] == "mpnet"
    model = SentenceTransformer(str(mpnet_path), device="cpu", local_files_only=True)
    texts = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell today."]
    embeddings = model.encode(texts, convert_to_tensor=True)  # (3, 768)
    assert embeddings.shape == (3, 768)
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)
    paraphrase, unrelated = (embeddings[0] @ embeddings[1]).item(), (embeddings[0] @ embeddings[2]).item()
    assert paraphrase > unrelated + 0.3, (paraphrase, unrelated)
