"""The script of a `launcher: torchrun` job in tests/server/test_torchrun_live.py: one of the
processes torchrun starts per GPU of a corral worker.

It writes what it saw to $SEEN_DIR/attempt-<CORRAL_ATTEMPT>-rank-<RANK>.json (the variables
torchrun and corral set, the GPU its LOCAL_RANK picks from CUDA_VISIBLE_DEVICES, and the
submitter's variables the test looks for), then trains as examples/ddp_train.py does (gloo, CPU):
it reports progress, checkpoints to $CORRAL_CHECKPOINT_DIR and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

SEEN = (
    "CUDA_VISIBLE_DEVICES",
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "NNODES",
    "CORRAL_GPUS_PER_WORKER",
    "CORRAL_ATTEMPT",
    "SUBMITTER_MARK",
    "MY_API_TOKEN",
    "CORRAL_TOKEN",
)


def main() -> None:
    visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    seen: dict[str, object] = {key: os.environ.get(key) for key in SEEN}
    # What `torch.cuda.set_device(LOCAL_RANK)` would open: the LOCAL_RANK-th visible device.
    seen["device"] = visible[int(os.environ["LOCAL_RANK"])]
    name = f"attempt-{os.environ['CORRAL_ATTEMPT']}-rank-{os.environ['RANK']}.json"
    target = Path(os.environ["SEEN_DIR"]) / name
    target.with_suffix(".tmp").write_text(json.dumps(seen))
    target.with_suffix(".tmp").replace(target)
    script = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
    sys.argv = [str(script)]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
