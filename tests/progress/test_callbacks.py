"""The Lightning and Hugging Face callbacks, each run in a real tiny training where its framework
is installed (skipped elsewhere)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.progress import ENV_VAR


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _lightning() -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning")
    return pl


def test_lightning_callback_in_a_real_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    pl = _lightning()
    torch = pytest.importorskip("torch")
    from corral.progress.lightning import CorralProgress

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    for accumulate, expected in [(1, [2, 4, 6]), (2, [2, 4, 6])]:
        path.unlink(missing_ok=True)
        trainer = pl.Trainer(
            max_steps=6,
            accumulate_grad_batches=accumulate,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            callbacks=[CorralProgress(every_n_steps=2)],
        )
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
        reported = lines(path)
        assert [r["step"] for r in reported] == expected, accumulate
        assert all(isinstance(r["loss"], float) and r["loss"] > 0 for r in reported)
        assert all(r["epoch"] == 0 for r in reported)
        # the run's total optimizer steps: max_steps (6), whatever the accumulation
        assert all(r["total_steps"] == 6 for r in reported), reported
    # Epochs instead of max_steps: 64 samples in batches of 4 are 16 batches an epoch, 8
    # optimizer steps with 2 accumulated; 2 epochs make 16.
    path.unlink(missing_ok=True)
    trainer = pl.Trainer(
        max_epochs=2,
        accumulate_grad_batches=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[CorralProgress(every_n_steps=4)],
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    assert [(r["step"], r["total_steps"]) for r in lines(path)] == [(s, 16) for s in (4, 8, 12, 16)]


def test_lightning_loss_from_callback_metrics_and_rank(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    _lightning()
    torch = pytest.importorskip("torch")
    from corral.progress.lightning import CorralProgress

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    callback = CorralProgress()

    def trainer(step: int, zero: bool = True, **metrics: Any) -> SimpleNamespace:
        return SimpleNamespace(
            is_global_zero=zero, global_step=step, current_epoch=1, callback_metrics=metrics
        )

    callback.on_train_batch_end(trainer(1, train_loss=torch.tensor(0.5)), None, None, None, 0)
    callback.on_train_batch_end(trainer(2, loss=torch.tensor(0.25)), None, {"other": 1}, None, 0)
    callback.on_train_batch_end(trainer(3), None, torch.tensor(float("nan")), None, 0)
    callback.on_train_batch_end(trainer(4), None, torch.ones(3), None, 0)
    callback.on_train_batch_end(trainer(5, zero=False), None, torch.tensor(1.0), None, 0)
    assert [(r["step"], r.get("loss")) for r in lines(path)] == [
        (1, 0.5),
        (2, 0.25),
        (3, None),
        (4, None),
    ]
    with pytest.raises(ValueError, match="every_n_steps: must be a positive integer"):
        CorralProgress(every_n_steps=0)


def test_huggingface_callback_in_a_real_train(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch = pytest.importorskip("torch")
    from corral.progress.huggingface import CorralCallback

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    class Tiny(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    torch.manual_seed(0)
    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(64)]
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=4,
        logging_steps=3,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = transformers.Trainer(
        model=Tiny(), args=args, train_dataset=data, callbacks=[CorralCallback(every_n_steps=2)]
    )
    trainer.train()
    reported = lines(path)
    step_only = [r["step"] for r in reported if "loss" not in r]
    with_loss = [r["step"] for r in reported if "loss" in r]
    assert step_only == [2, 4, 6]
    assert with_loss == [3, 6]  # the final summary logs train_loss, not loss: not reported
    assert all(isinstance(r["loss"], float) for r in reported if "loss" in r)
    assert all(0 < r["epoch"] <= 1 for r in reported)
    assert all(r["total_steps"] == 6 for r in reported)  # state.max_steps


def test_huggingface_callback_on_other_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    pytest.importorskip("transformers")
    from corral.progress.huggingface import CorralCallback

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    callback = CorralCallback()
    other = SimpleNamespace(is_world_process_zero=False, global_step=1, epoch=0.5)
    zero = SimpleNamespace(is_world_process_zero=True, global_step=2, epoch=None)
    callback.on_step_end(None, other, None)
    callback.on_log(None, other, None, logs={"loss": 1.0})
    callback.on_log(None, zero, None, logs={"loss": float("nan")})
    callback.on_log(None, zero, None, logs=None)
    callback.on_log(None, zero, None, logs={"loss": 0.5})
    assert [(r["step"], r["loss"], "epoch" in r) for r in lines(path)] == [(2, 0.5, False)]


# One rank of a two-process gloo group (127.0.0.1): CorralCheckpoint's step ends, the stop
# signal marked on rank 1 only at the second of three steps; prints what each step told the
# Trainer, as JSON.
RANK = """
import json, sys
from types import SimpleNamespace
import torch.distributed as dist
from corral.progress.huggingface import CorralCheckpoint
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
callback, seen = CorralCheckpoint(), []
for step in range(3):
    callback.stopping = rank == 1 and step == 1
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    callback.on_step_end(SimpleNamespace(device="cpu"), None, control)
    seen.append([control.should_save, control.should_training_stop])
dist.destroy_process_group()
print(json.dumps(seen))
"""


def test_huggingface_checkpoint_stops_every_rank_at_the_step_one_rank_was_signalled(
    tmp_path: Path,
) -> None:
    # Under torchrun the stop signal may reach the ranks at different steps; each must save and
    # stop at the same one, or the checkpoint's shards come from different steps and the ranks
    # that go on hang in their next collective. Rank 1 alone is marked at the second step:
    # expected on both ranks, step by step, [save, stop] = no, yes (shared by the all-reduce),
    # and no again at the third (the mark is per step, not sticky across the group).
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        answers = [rank.communicate(timeout=300) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    expected = [[False, False], [True, True], [False, False]]
    for (out, err), rank in zip(answers, ranks, strict=True):
        assert rank.returncode == 0, err[-2000:]
        assert json.loads(out) == expected


def test_huggingface_resume_path_is_the_newest_complete_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    pytest.importorskip("transformers")
    from corral.progress.huggingface import output_dir, resume_path

    for step, complete in ((5, True), (10, True), (15, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if complete:  # the Trainer writes trainer_state.json last
            (folder / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-20").write_text("a file, not a checkpoint")
    (tmp_path / "checkpoint-x").mkdir()
    # 15 was cut short by a kill (no trainer_state.json): 10 is the newest complete one
    assert resume_path(tmp_path) == str(tmp_path / "checkpoint-10")
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(tmp_path))
    assert (output_dir(), resume_path()) == (str(tmp_path), str(tmp_path / "checkpoint-10"))
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(tmp_path / "none-yet"))
    assert resume_path() is None
    monkeypatch.delenv("CORRAL_CHECKPOINT_DIR")
    assert output_dir() == "checkpoints"


def test_lightning_resume_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    _lightning()
    from corral.progress.lightning import resume_path

    monkeypatch.delenv("CORRAL_CHECKPOINT_DIR", raising=False)
    assert resume_path() is None  # outside corral: start afresh
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(tmp_path))
    assert resume_path() is None  # the first attempt: nothing saved yet
    (tmp_path / "last.ckpt").write_bytes(b"saved")
    assert resume_path() == str(tmp_path / "last.ckpt")


def test_lightning_checkpoint_every_n_steps_and_a_resume(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    pl = _lightning()
    torch = pytest.importorskip("torch")
    from corral.progress.lightning import CorralCheckpoint, resume_path

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(tmp_path / "ckpt"))

    def fit(max_steps: int) -> Any:
        trainer = pl.Trainer(
            max_steps=max_steps,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            callbacks=[CorralCheckpoint(every_n_steps=2)],
        )
        trainer.fit(
            Tiny(), torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=resume_path()
        )
        return trainer

    fit(5)  # saves after steps 2 and 4 (5 is not a multiple of 2)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.ckpt"]
    saved = torch.load(resume_path(), map_location="cpu", weights_only=False)
    assert saved["global_step"] == 4
    # A new fit resumes at step 4: to 7, it makes 3 more steps and saves after step 6.
    resumed = fit(7)
    assert resumed.global_step == 7
    saved = torch.load(resume_path(), map_location="cpu", weights_only=False)
    assert saved["global_step"] == 6
