import json

from agentd.stacks.merge import Frame, ThreadSample, merge
from tuiprof.analysis.stacks_report import build_report, folded, render_text, report_json


def job():
    main = Frame("<module>", "/job/train.py", 0)
    samples = [ThreadSample(r, "MainThread", (main, Frame("all_reduce", "/t/c10d.py"))) for r in (0, 1, 3)]
    samples.append(ThreadSample(2, "MainThread", (main, Frame("stuck_here", "/job/train.py"))))
    samples += [ThreadSample(r, "pt_worker", (Frame("run", "/t/threading.py"),)) for r in range(4)]
    return merge(samples)


def test_json_schema():
    doc = report_json(build_report(job()))
    json.dumps(doc)
    assert doc["ranks"] == 4 and doc["thread"] == "MainThread"
    assert [(c["ranks"], c["count"], c["leaf"]) for c in doc["classes"]] == [
        ("2", 1, "stuck_here (train.py)"),
        ("0-1,3", 3, "all_reduce (c10d.py)"),
    ]
    assert doc["classes"][0]["frames"] == ["<module> (train.py)", "stuck_here (train.py)"]
    assert [s["ranks"] for s in doc["suspects"]] == ["2"]
    main = next(t for t in doc["tree"] if t["thread"] == "MainThread")
    module = main["children"][0]
    assert (module["function"], module["ranks"], module["missing"]) == ("<module>", "0-3", "")
    assert [(c["function"], c["ranks"], c["missing"]) for c in module["children"]] == [
        ("all_reduce", "0-1,3", "2"),
        ("stuck_here", "2", "0-1,3"),
    ]


def test_text_shows_missing_ranks_and_suspects():
    text = render_text(build_report(job()))
    assert "stuck_here (train.py)  [2]  not: [0-1,3]" in text
    assert "Suspects:\n  rank 2 is in `stuck_here (train.py)`" in text
    assert text.index("MainThread") < text.index("pt_worker")


def test_folded_lines_count_ranks_per_stack():
    assert folded(job()).splitlines() == [
        "MainThread;<module> (train.py);all_reduce (c10d.py) 3",
        "MainThread;<module> (train.py);stuck_here (train.py) 1",
        "pt_worker;run (threading.py) 4",
    ]
