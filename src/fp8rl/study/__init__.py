"""Studies built on the trainer: the demo, sweeps over arms x seeds, report plots, and
shadow diagnostics of a checkpoint. Imports every layer below it; `train` never imports it."""
