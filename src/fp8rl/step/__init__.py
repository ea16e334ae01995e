"""One RL step, a function of (StepContext, step): it touches no file and no Trainer."""
