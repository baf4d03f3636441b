"""The Lightning and Hugging Face callbacks, each run in a real tiny training where its framework
is installed (skipped elsewhere)."""

from __future__ import annotations

import json
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
