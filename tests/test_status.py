"""`python -m batchspec.status`: completion across shards from the output dir alone."""

from __future__ import annotations

import shutil

import pytest

from batchspec.jobs import status
from batchspec.jobs.config import ASSETS_DIR
from conftest_jobs import one_thread, run_inprocess  # noqa: F401 (fixture)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not (ASSETS_DIR / "demo" / "target").is_dir(), reason="the demo pair is not built")]

ARGS = ["job=demo", "source.limit=9", "sampling.max_new_tokens=4", "output.rows_per_file=2", "output.dir=out",
        "shard.count=3", "progress.mode=off"]


def test_status_reports_missing_shards_then_complete_then_duplicates(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert status.main([str(out)]) == 2
    assert "not a batchspec output dir" in capsys.readouterr().err
    for index in (1, 2):
        assert run_inprocess(tmp_path, *ARGS, f"shard.index={index}", monkeypatch=monkeypatch) == 0
    capsys.readouterr()

    assert status.main([str(out)]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith(f"{out}: INCOMPLETE: 6 rows (0 errors), 2/3 shards finished"), printed
    assert "    0 of 3   missing         0       0      0  no finish marker" in printed
    report = status.status(out)
    assert [(s["shard"], s["finished"], s["rows"], s["parts"]) for s in report["shards"]] == [
        (0, False, 0, 0), (1, True, 3, 2), (2, True, 3, 2)]

    assert run_inprocess(tmp_path, *ARGS, "shard.index=0", monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    assert status.main([str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: complete: 9 rows (0 errors), 3/3 shards finished")

    part = sorted((out / "data").glob("shard-00001-*.parquet"))[0]
    shutil.copy(part, part.with_name(part.name.replace("part-000000", "part-000099")))
    assert status.main([str(out), "--json"]) == 1
    report = status.status(out)
    assert not report["complete"] and report["rows"] == 11 and report["duplicate_id_count"] == 2
    assert "DUPLICATE ids" in status.format_status(report)


@pytest.mark.parametrize("count,advice", [(1, "rerun the same command to resume"),
                                          (2, "resubmit the array, or rerun this shard's command, to resume")])
def test_a_stopped_shard_says_how_to_resume(tmp_path, monkeypatch, capsys, count, advice):
    """A shard without its finish marker (killed): one shard is resumed by running the same command again; an
    array's shard by resubmitting the array (or that shard's command)."""
    args = [a for a in ARGS if not a.startswith("shard.count")] + [f"shard.count={count}", "shard.index=0"]
    assert run_inprocess(tmp_path, *args, monkeypatch=monkeypatch) == 0
    for marker in (tmp_path / "out" / "shards").glob("shard-*.json"):
        marker.unlink()  # as if the run was killed before it finished
    capsys.readouterr()
    assert status.main([str(tmp_path / "out")]) == 1
    assert f"no finish marker: running, stopped or cancelled ({advice})" in capsys.readouterr().out
