"""Withdraw a finalist's last stored repeat from a study file, with its reason, so that the next
finalists block runs it again (tuner.search.finalists.withdraw_repeat; the RUNBOOK says when).

    .venv/bin/python scripts/gpu/withdraw_repeat.py DB STUDY TRIAL REPEAT REASON
"""

from __future__ import annotations

import json
import sys

import optuna

from tuner.errors import TunerError
from tuner.search.finalists import withdraw_repeat


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    db, name, number, repeat, reason = argv
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    try:
        run = withdraw_repeat(study, int(number), int(repeat), reason)
    except TunerError as err:
        print(f"withdraw_repeat: {err}", file=sys.stderr)
        return 2
    print(f"trial {number}: repeat {repeat} withdrawn ({reason}); its metrics: {json.dumps(run['metrics'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
