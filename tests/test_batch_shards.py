"""`python -m cosy batch --shard i/n`: two processes split one manifest against one vLLM backend (the
session's), each writing its own results file into the shared output folder."""
from __future__ import annotations

from test_batch import TEXTS, ZS_TEXT, ZS_WAV, cosy, records, write_manifest


def test_two_shards_split_one_manifest_against_one_backend(backend, tiny_model_dir, tmp_path):
    m = write_manifest(tmp_path / "m.jsonl", [{"id": f"s{k:02d}", "text": TEXTS[k % len(TEXTS)], "seed": k,
                                               "prompt_wav": str(ZS_WAV), "prompt_text": ZS_TEXT}
                                              for k in range(12)])
    out = tmp_path / "out"
    procs = [cosy("batch", m, "--out", out, "--shard", f"{i}/2", "--model_dir", tiny_model_dir, "--data_dir",
                  tmp_path / "data", "--llm_base_url", backend.url, "--llm_api_key", backend.api_key,
                  "--progress", "log")
             for i in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    shard = [records(out, f"results.{i}-of-2.jsonl") for i in range(2)]
    assert set(shard[0]) == {f"s{k:02d}" for k in range(0, 12, 2)}
    assert set(shard[1]) == {f"s{k:02d}" for k in range(1, 12, 2)}
    assert all(r["status"] == "ok" and (out / r["file"]).stat().st_size > 44 for s in shard for r in s.values())
    assert not (out / "results.jsonl").exists()  # shards never write the same file
    assert all("LM backends" in log for log in logs), logs
