import xml.etree.ElementTree as ET

from tuiprof.analysis.flamegraph import flamegraph_svg
from agentd.stacks.merge import Frame, ThreadSample, merge

NS = "{http://www.w3.org/2000/svg}"


def job():
    main = Frame("main", "train.py")
    samples = [ThreadSample(r, "MainThread", (main, Frame("all_reduce", "c10d.py"))) for r in range(7)]
    samples.append(ThreadSample(7, "MainThread", (main, Frame("stuck_<here>", "train.py"))))
    return merge(samples)


def boxes(svg):
    root = ET.fromstring(svg)
    out = {}
    for g in root.iter(f"{NS}g"):
        rect = g.find(f"{NS}rect")
        out[g.find(f"{NS}title").text.splitlines()[0]] = (float(rect.get("width")), rect.get("fill"), g.find(f"{NS}title").text)
    return out


def test_widths_follow_rank_counts_and_the_odd_rank_has_its_own_colour():
    svg = flamegraph_svg(job(), width=800)
    found = boxes(svg)  # parses: the label with <> was escaped
    wide, narrow = found["all_reduce (c10d.py)"], found["stuck_<here> (train.py)"]
    assert abs((wide[0] + 0.5) / (narrow[0] + 0.5) - 7) < 0.01
    assert found["main (train.py)"][0] + 0.5 == 800
    assert wide[1] != narrow[1]
    assert "ranks [7] (1)\nnot reached by [0-6]" in narrow[2]


def test_empty_tree_is_still_an_svg():
    ET.fromstring(flamegraph_svg(merge([])))
