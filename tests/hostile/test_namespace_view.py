"""The second user reaches this checkout and its interpreter wherever they live (a clone in root's 0700
home, a pyenv under /root): the namespace covers the blocking folder with a view of just those paths."""

from __future__ import annotations

import pathlib
import subprocess
import tempfile

from testkit.namespaces import traversal_view


def test_a_path_under_a_0700_folder_is_reachable_in_the_view_and_nothing_else_is(hostile_user):
    with tempfile.TemporaryDirectory(prefix="tpview-") as home:
        private = pathlib.Path(home)  # 0700, as root's home on Debian
        checkout = private / "src" / "tuiprof"
        checkout.mkdir(parents=True)
        (checkout / "code.py").write_text("print('reached')\n")
        (private / "secret").write_text("root's\n")
        read_as_user = [*hostile_user.become(), "cat"]
        outside = subprocess.run([*read_as_user, str(checkout / "code.py")], capture_output=True, text=True)
        assert outside.returncode != 0 and "Permission denied" in outside.stderr

        steps = traversal_view([checkout])
        script = " && ".join([*steps, subprocess.list2cmdline([*read_as_user, str(checkout / "code.py")]),
                              f"! {subprocess.list2cmdline([*read_as_user, str(private / 'secret')])}",
                              f"! test -e {private / 'secret'}"])
        inside = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
                                capture_output=True, text=True, timeout=30)
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout == "print('reached')\n"
