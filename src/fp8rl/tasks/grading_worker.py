"""A grading worker process (started by grading.GraderPool; not for direct use).

Reads [gold, answer, timeout_s, budget_s] JSON lines (budget_s may be null or left out) on
stdin and writes one [gold_parsed, parsed, correct, timeout] line per request on stdout;
exits at end of input, so it never outlives its parent's pipe.
"""

import json
import os
import sys

from fp8rl.tasks.grading import grade_strings


def main() -> None:
    # Replies go to a private copy of stdout; anything a library prints goes to stderr and
    # cannot corrupt the protocol.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for line in sys.stdin:
        try:
            gold, answer, timeout_s, *budget = json.loads(line)
            g = grade_strings(gold, answer, timeout_s, budget[0] if budget else None)
            reply = [g.gold_parsed, g.parsed, g.correct, g.timeout]
        except Exception:
            reply = [None, False, False, False]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
