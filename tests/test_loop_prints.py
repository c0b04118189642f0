"""The prints a training loop writes itself, in the shapes users paste: each line read as one
record on the count it names, a NaN found on its own record, and a healthy run flagged nothing.

Each shape is written twelve times (its ``{i}`` a counter from 1, ``{j}`` a hundred times it, its
``{v}`` a loss, ``{V}`` the same with a NaN printed ``NAN``), the eighth print NaN; and forty
times as a healthy run, the loss falling with a little noise. One shape read otherwise is left
out: ``e1 loss=6.7``, a name that holds its counter."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import read_log

SHAPES = [
    "{i} {v} 0.5",  # print(epoch, loss, acc): a table without its header, its columns numbered
    "Epoch {i} loss: {v}",
    "Epoch {i} loss is {v}",
    "The training loss for Epoch {i} is {v}",
    "training loss for epoch {i}: {v}",
    "Epoch {i}, training loss is {v}",
    "After epoch {i} the loss is {v}",
    "loss for epoch {i} = {v}",
    "Epoch {i}: loss {v}",
    "epoch {i} train_loss {v} val_loss {v}",
    "Iteration {i}, loss = {v}",
    "Loss at step {i} is {v}",
    "step {i} loss {v}",
    "At iteration {i}, the loss is {v}",
    "Epoch {i} - loss: {v}",
    "Epoch [{i}/20], Loss: {v}",
    "epoch={i} loss={v}",
    "[{i}] loss: {v}",
    "Epoch {i}\\tLoss {v}",
    "Epoch {i} | Train Loss: {v} | Val Loss: {v}",
    "Epoch [{i}/5], Step [{j}/600], Loss: {v}",
    "Epoch: {i}, Loss: {v}",
    "Epoch: {i} Loss: {v}",
    "Epoch {i}/20 loss: {v}",
    "Epoch {i}/20 - loss: {v} - acc: 0.5",
    "epoch: {i}, train loss: {v}, val loss: {v}",
    "[Epoch {i}] loss: {v}",
    "[epoch {i}] train loss {v}",
    "Epoch {i} | loss {v}",
    "Ep {i}: loss={v}",
    "iter {j}: loss {v}",
    "Iter {j} | Loss {v}",
    "it {j} loss {v}",
    "{j} {v}",
    "{j}: loss={v}",
    "Step {j}: loss = {v}",
    "Step {j}/1000 loss {v}",
    "step: {j}, loss: {v}",
    "global_step={j}, loss={v}",
    "Batch {j}, Loss: {v}",
    "Batch: {j} Loss: {v}",
    "Episode {i} reward: {v}",
    "Episode {i}\\tReward: {v}",
    "episode {i}, total reward {v}",
    "Ep {i} | Return {v}",
    "loss: {v}",
    "Loss = {V}",
    "{{'epoch': {i}, 'loss': {v}}}",
    "Epoch {i}: {{'loss': {v}, 'acc': 0.5}}",
    "{{'loss': {v}, 'learning_rate': 1e-05, 'epoch': {i}.0}}",
    "Epoch {i}/12\\n100/100 - 3s - loss: {v} - accuracy: 0.8000",
    "Epoch {i}: 100%|██████████| 50/50 [00:01<00:00, 30.1it/s, loss={v}, v_num=0]",
    "step {j} | loss {v} | lr 1e-4",
    "Iter: {j}/1200 Loss: {v}",
    "Iteration: {j}, Loss: {v}",
    "[{j}/1200] loss: {v}",
    "({j}/1200) loss: {v}",
    "{j}/1200 loss: {v}",
    "E{i} B100 loss {v}",
    "train: epoch {i} loss {v} acc 0.4",
    "Train Epoch {i} | Loss {v} | Acc 40.0%",
    "Episode: {i}, Reward: {v}, Steps: 200",
    "ep {i} | ret {v}",
    "Ep. {i} Score: {v} Avg score: 15.0",
    "episode {i} total_reward {v} epsilon 0.5",
    "2024-01-01 00:00:00,000 - INFO - Epoch {i} - loss: {v}",
    "Epoch {i} Batch 100 Loss {v}",
    "Epoch {i} Loss {v} Accuracy 0.4000",
    "It {j}: loss={v}",
    "epoch {i} iter {j} loss {v}",
    "[Epoch {i}][Iter {j}] loss: {v}",
    "Epoch: {i} | Iter: {j} | Loss: {v}",
    "INFO:root:Epoch {i}, loss {v}",
    "epoch {i}, loss {v}, val_loss {v}",
    "Epoch {i}: train_loss={v}, val_loss={v}",
    "Loss after epoch {i}: {v}",
    "Average loss at step {j}: {v}",
    "Minibatch loss at step {j}: {v}",
    "loss at iteration {j}: {v}",
    "Epoch {i} finished. Loss: {v}",
    "Finished epoch {i}, loss {v}",
    "Epoch {i} completed with loss {v}",
    "step={j} loss={v} grad_norm=1.2",
    "[step {j}] loss={v}",
    "global step {j}: loss {v}",
    "| epoch {i} | loss {v} |",
    "Epoch {i:03d} | Train Loss {v} | Val Loss {v}",
    "Epoch {i}, Step {j}, Loss: {v}",
    "Step {j} - loss: {v} - lr: 1e-5",
    "[Step {j}] loss={v}, reward=0.5",
    "step: {j}/1200, loss: {v}, reward_mean: 0.5, kl: 0.01",
    "Iteration {j} | Loss {v} | Reward 0.5 | KL 0.01",
    "{{'train/loss': {v}, 'train/global_step': {j}}}",
    "Train Epoch: {i} \\tLoss: {v}",
    "epoch {i:3d} | loss {v} | acc 0.5",
    "[{i:02d}/12] train_loss: {v} val_loss: 0.5",
    "it: {j}, loss: {v}",
    "Iter {j}: loss = {v}",
    "loss={v} step={j}",
    "[2024-01-01 00:00:00] step {j}: loss={v}",
    "INFO:__main__:step {j} loss {v}",
    "global_step {j} train_loss {v}",
    "Epoch {i} Step {j} Loss {v}",
    "epoch {i} step {j} loss {v} grad_norm 1.0",
    "Batch {j}/1200, Loss: {v}",
    "Round {i}: loss {v}",
    "Update {i}, reward {v}",
    "Episode {i}/100 | avg reward {v}",
    "step {j}: train loss {v}, val loss 0.5",
    "Step {j}: {{'loss': {v}, 'lr': 1e-05}}",
    "[Iter {j}] Loss: {v} | LR: 0.001",
    "Iter {j}/1200 - Loss: {v} - Time: 0.5s",
    "epoch: {i} loss: {v} accuracy: 0.5",
    "Epoch {i}:\\tloss={v}\\tacc=0.5",
    "EPOCH {i} LOSS {v}",
    "Epoch #{i} loss={v}",
    "(Epoch {i}) Loss: {v}",
    "{i}, {v}",
    "Epoch {i}, loss={v}, grad norm={v}",
    "step {j}, loss {v}, lr 1.0e-04, tokens/s 1234",
]


def _write(tmp_path: Path, shape: str, values: list[str]) -> Path:
    path = tmp_path / "paste.log"
    lines = [
        shape.replace("\\t", "\t")
        .replace("\\n", "\n")
        .format(i=i, j=100 * i, v=v, V=v.upper() if v == "nan" else v)
        for i, v in enumerate(values, 1)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("shape", SHAPES)
def test_a_nan_is_found_on_the_record_of_its_print(tmp_path: Path, shape: str) -> None:
    values = [f"{7.0 - 0.3 * i:.4f}" if i != 8 else "nan" for i in range(1, 13)]
    trace = read_log(_write(tmp_path, shape, values))
    steps = [s["step"] for s in trace.steps]
    assert len(steps) == 12
    found = [f for f in diagnose(trace) if f.type == "nonfinite"]
    assert found and found[0].step == steps[7]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_healthy_run_printed_so_is_flagged_nothing(tmp_path: Path, shape: str) -> None:
    values = [f"{2.5 * math.exp(-i / 15) + 0.4 + 0.03 * math.sin(2.7 * i):.4f}" for i in range(1, 41)]
    found = [f for f in diagnose(read_log(_write(tmp_path, shape, values))) if f.severity != "info"]
    assert not found
