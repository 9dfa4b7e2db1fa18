"""``python -m autotune.trial [--ranks N] SPEC.json RESULT.json``: one trial process.

Exit code 0 means the result file was written (whatever the trial's status); anything
else means the process died before that. ``--ranks N`` starts a DDP trial of N ranks.
"""

import sys
import time

T0 = time.perf_counter()  # before torch is imported: the trial's start-up cost counts

from .guard import die_with_driver, launch_ranks  # noqa: E402

die_with_driver()
if sys.argv[1:2] == ["--ranks"]:
    launch_ranks(int(sys.argv[2]), sys.argv[3], sys.argv[4])

from .main import main  # noqa: E402  (imports torch)

main(sys.argv[1:], started=T0)
