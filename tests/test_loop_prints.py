"""The prints a training loop writes itself, in the shapes users paste: each line read as one
record on the count it names, a NaN found on its own record, and a healthy run flagged nothing.

Each shape is written twelve times (its ``{i}`` a counter from 1, ``{j}`` a hundred times it,
``{k}`` ten times it, its ``{v}`` a loss, ``{V}`` the same with a NaN printed ``NAN``), the eighth
print NaN; and forty times as a healthy run, the loss falling with a little noise. One shape read
otherwise is left out: ``e1 loss=6.7``, a name that holds its counter."""

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


# the frameworks' own prints, as users paste them (each with its records' other fields): OpenNMT,
# flair, mmdetection 2.x, timm, CycleGAN, torchtitan, nanoGPT, LitGPT, GPT-NeoX, TF Estimator,
# CLU, XGBoost, LightGBM (Python and R), CatBoost, spaCy, Keras, Lightning, diffusers, kohya,
# torchtune, DeepSpeed's engine beside HF's dicts, OpenRLHF, fairseq, detectron2, YOLOv5/v8,
# allennlp, Keras-GAN, ML-Agents, CleanRL, Tianshou, PaddleDetection, PaddleOCR, YOLOX, NeMo,
# MXNet, Marian, PyG, DGL, GluonTS, the TF Object Detection API, Composer, nanotron, OLMo,
# open_clip, DINO / DETR's MetricLogger, Swin, the PyTorch ImageNet example, PyTorch-GAN, PaddleOCR's
# old trainer, a Keras GCN, RL tutorials' episode scores, NeuralPDE's callback, CNTK, the Informer
# family of forecasters (its iterations, its epochs), RecBole, DINOv2, a DeepLab loop, a Q-learner,
# the TF Object Detection API's step line with its loss, DeiT / ConvNeXt's epoch summaries alone,
# EESEN's CTC trainer, vit-pytorch's example loop between its bars, a list of values typed by hand,
# VocGAN's averages before its bar
FRAMEWORKS = [
    (
        "[2020-01-01 10:00:00,000 INFO] Step {j}/200000; acc:  {i}.50; ppl: {v}; xent: {v}; lr: "
        "0.00100; 2000/2000 tok/s;     10 sec"
    ),
    "epoch 1 - iter {i}/100 - loss {v} - samples/sec: 100.00 - lr: 0.100000",
    (
        "2024-01-01 10:00:00,000 epoch 1 - iter {i}/100 - loss {v} - time (sec): 1.00 - "
        "samples/sec: 100.00 - lr: 0.100000 - momentum: 0.000000"
    ),
    (
        "Epoch [1][{j}/7330]\tlr: 2.000e-02, eta: 1 day, 0:00:00, time: 0.500, data_time: 0.010, "
        "memory: 3000, loss_rpn_cls: 0.6000, loss_rpn_bbox: 0.1000, loss_cls: 0.9000, acc: "
        "80.0000, loss_bbox: 0.4000, loss: {v}"
    ),
    (
        "Train: 0 [{j:4d}/1251 ( {i}%)]  Loss: {v} ({v})  Time: 0.500s,  512.00/s  (0.500s,  "
        "512.00/s)  LR: 1.000e-04  Data: 0.010 (0.010)"
    ),
    (
        "(epoch: 1, iters: {j}, time: 0.123, data: 0.001) D_A: 0.250 G_A: {v} cycle_A: 1.200 "
        "idt_A: 0.500 D_B: 0.240 G_B: 0.310 cycle_B: 1.100 idt_B: 0.450"
    ),
    (
        "[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - step: {j:3d}  loss: {v}  "
        "memory: 30.00GiB(40.00%)  tps: 1,000  tflops: 100.00  mfu: 30.00%"
    ),
    "iter {j}: loss {v}, time 100.00ms, mfu 30.00%",
    "step {j}: train loss {v}, val loss 4.6104",
    "iter {j} | step {i}: loss {v}, iter time: 100.00 ms",
    (
        " samples/sec: 10.000 | iteration {j:8d}/  320000 | elapsed time per iteration (ms): "
        "100.0 | learning rate: 1.000E-04 | approx flops per GPU: 100.0TFLOPS | lm_loss: {V} | "
        "loss scale: 65536.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    ),
    "INFO:tensorflow:loss = {v}, step = {j} (10.000 sec)",
    "[{j}] train_loss={v}, learning_rate=0.1",
    "I0101 10:00:00.000000 140000000000000 logging_writer.py:48] [{j}] loss={v}, learning_rate=0.1",
    "[{i}]\ttrain-rmse:{v}\teval-rmse:3.00000",
    "[{i}]\tvalidation_0-logloss:{v}\tvalidation_1-logloss:0.60000",
    "{i}:\tlearn: {v}\ttest: 0.6000000\tbest: 0.6000000 (0)\ttotal: 10ms\tremaining: 1s",
    "  0     {j}         {v}       30.00   20.00   25.00   22.00    0.50",
    "[{i},  {j:5d}] loss: {v}",
    (
        "Epoch {i}/20\\n100/100 [==============================] - 2s 20ms/step - loss: {v} - "
        "accuracy: 0.{i:02d}00 - val_loss: {v} - val_accuracy: 0.{i:02d}50"
    ),
    "Epoch {i}: 100%|██████████| 782/782 [00:20<00:00, 38.50it/s, loss={v}, v_num=0]",
    "1|{j}|Loss: {v}: 100%|██████████| 100/100 [01:00<00:00, 1.60it/s]",
    (
        "[2023-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={j}, skipped=0, "
        "lr=[1e-05], mom=[(0.9, 0.95)]\\n{{'loss': {v}, 'grad_norm': 1.0, 'learning_rate': 1e-05, "
        "'epoch': 0.{i}}}"
    ),
    (
        "| epoch 001:   {j} / 1000 loss={v}, nll_loss=3.000, ppl=8.00, wps=10000, ups=1, "
        "wpb=1000, bsz=32, num_updates={j}, lr=0.0001, gnorm=1.000, clip=0.000, train_wall=10, wall=100"
    ),
    (
        "2021-01-01 10:00:00 | INFO | train_inner | epoch 001:    {j} / 1000 loss={v}, "
        "nll_loss=3.000, ppl=8.00, wps=10000, ups=1.00, wpb=1000, bsz=32, num_updates={j}, "
        "lr=0.0001, gnorm=1.000, loss_scale=128, train_wall=10, gb_free=10, wall=100"
    ),
    (
        "[04/12 10:00:00 d2.utils.events]:  eta: 0:10:00  iter: {j}  total_loss: {v}  loss_cls: "
        "0.5000  loss_box_reg: 0.3000  time: 0.5000  data_time: 0.0100  lr: 0.0200  max_mem: 3000M"
    ),
    "2024-01-01 10:00:00 | train | INFO | Epoch: {i} Step: {j} Loss: {v} LR: 1.0e-05",
    "Iteration {j}, loss = {v}",
    "Iteration {j}/10000 | loss: {v} | lr: 1e-4",
    "it: {j} | loss: {v}",
    "global step {j}: loss={v}, lr=1e-05",
    "[Epoch {i}/20] [Batch {j}/938] [D loss: 0.5000] [G loss: {v}]",
    (
        '{{"epoch": {i}, "update": 0.{i}, "loss": "{v}", "nll_loss": "3.0", "ppl": "8.0", "wps": '
        '"10000", "num_updates": "{j}", "lr": "0.0001", "gnorm": "1.0"}}'
    ),
    "epoch={i} step={j} loss={v} grad_norm=1.0 lr=1e-05",
    "Step {j} | Loss {v} | LR 1e-05 | Grad Norm 1.0",
    "Steps:  {i}%|▏         | {k}/1000 [00:10<10:00,  1.60it/s, loss={v}, lr=1e-05]",
    "steps:  {i}%|█         | {k}/1000 [01:00<09:00,  1.60it/s, avr_loss={v}]",
    "{{'loss': {v}, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.{i}}}",
    (
        "Train epoch [1/1]:  {i}%|█         | {k}/1000 [01:00<09:00, 1.60it/s, policy_loss={v}, "
        "kl=0.0100, reward=0.{i:02d}00, return=0.{i:02d}00, response_length=300, total_length=500]"
    ),
    (
        "      Epoch    GPU_mem   box_loss   obj_loss   cls_loss  Instances       Size\\n      "
        "{i}/299      3.5G    {v}   0.04565   0.03451       165       640: 100%|██████████| "
        "100/100 [01:00<00:00,  1.60it/s]"
    ),
    (
        "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\\n      "
        "{i}/100      2.1G      {v}      2.345      1.456         45        640: "
        "100%|██████████| 100/100 [01:00<00:00,  1.60it/s]"
    ),
    "accuracy: 0.{i:02d}00, loss: {v} ||: {i}%|#         | {k}/1000 [00:10<00:00, 10.00it/s]",
    "[INFO] 3DBall. Step: {j}. Time Elapsed: 10.0 s. Mean Reward: {v}. Std of Reward: 0.500. Training.",
    "global_step={j}, episodic_return={v}",
    "Epoch #{i}: 10001it [00:10, 1000.00it/s, env_step={j}, len=20, loss={v}, n/ep=0, n/st=10, rew=20.00]",
    (
        "[01/01 10:00:00] ppdet.engine INFO: Epoch: [0] [{j:4d}/7000] learning_rate: 0.001000 "
        "loss: {v} loss_cls: 1.000000 eta: 1:00:00 batch_cost: 0.5000 data_cost: 0.0100 ips: "
        "10.0000 images/s"
    ),
    (
        "[2022/01/01 10:00:00] ppocr INFO: epoch: [1/500], global_step: {j}, lr: 0.001000, acc: "
        "0.000000, norm_edit_dis: 0.100000, loss: {v}, avg_reader_cost: 0.01000 s, "
        "avg_batch_cost: 0.50000 s, avg_samples: 32.0, ips: 64.00000 samples/s, eta: 1:00:00"
    ),
    (
        "2021-01-01 10:00:00 | INFO     | yolox.core.trainer:247 - epoch: 1/300, iter: {j}/1000, "
        "mem: 5000Mb, iter_time: 0.500s, data_time: 0.010s, total_loss: {v}, iou_loss: 3.0, "
        "l1_loss: 0.0, conf_loss: 5.0, cls_loss: 2.5, lr: 1.000e-04, size: 640, ETA: 1 day, 0:00:00"
    ),
    "[{j}/300000] Train loss: {v}, Valid loss: 0.41235, Elapsed_time: 100.00000",
    (
        "Epoch 0: {i}%|█         | {j}/10000 [00:10<01:30, 10.00it/s, v_num=0, "
        "reduced_train_loss={v}, global_step={j}.0, consumed_samples=800.0, train_step_timing in "
        "s=0.100]"
    ),
    "Epoch[0] Batch [{j}]\tSpeed: 100.00 samples/sec\tperplexity={v}\tlearning-rate=1.0e-04",
    (
        "[2020-01-01 10:00:00] Ep. 1 : Up. {j} : Sen. 100,000 : Cost {v} * 1,000,000 @ 10,000 "
        "after 10,000,000 : Time 100.00s : 10000.00 words/s : gNorm 1.0000 : L.r. 3.0000e-04"
    ),
    (
        "| epoch {i:03d} | loss {v} | ppl {v} | wps 10000 | ups 1 | wpb 1000 | bsz 32 | "
        "num_updates {j} | lr 0.0001 | gnorm 1.0 | clip 0.0 | oom 0 | wall 100 | train_wall 90"
    ),
    "Epoch: {i:03d}, Loss: {v}, Train: 0.3000, Val: 0.3000, Test: 0.3000",
    "Epoch {i:05d} | Loss {v} | Train Acc 0.3000 | Val Acc 0.3000 | Time(s) 0.1000",
    "100%|██████████| 50/50 [00:02<00:00, 20.00it/s, epoch={i}/12, avg_epoch_loss={v}]",
    (
        "I0101 10:00:00.000000 140000000000000 model_lib_v2.py:705] Step {j} per-step time "
        "0.500s\\nI0101 10:00:00.000000 140000000000000 model_lib_v2.py:708] "
        "{{'Loss/classification_loss': 0.5,\\n 'Loss/localization_loss': 0.3,\\n "
        "'Loss/regularization_loss': 0.1,\\n 'Loss/total_loss': {v},\\n 'learning_rate': 0.01}}"
    ),
    (
        "[batch={j}/10000]:\\n\t Train time/epoch: 0\\n\t Train time/batch: {j}\\n\t Train "
        "loss/train/total: {v}\\n\t Train metrics/train/LanguageCrossEntropy: {v}\\n\t Train "
        "lr-DecoupledAdamW/group0: 0.0001"
    ),
    (
        "[default0]:01/01/2024 10:00:00 [INFO|DP=0|PP=0|TP=0]: iteration: {j} / 10000 | "
        "consumed_tokens: 1M | elapsed_time_per_iteration_ms: 1K | tokens_per_sec: 1M | "
        "tokens_per_sec_per_gpu: 100K | global_batch_size: 256 | lm_loss: {v} | lr: 0.0003 | "
        "model_tflops_per_gpu: 100 | hardware_tflops_per_gpu: 100 | grad_norm: 1.5"
    ),
    (
        "[2024-01-01 10:00:00] INFO     [olmo.train:816, rank=0] [step={j}/739328]\\n    "
        "train/CrossEntropyLoss={v}\\n    train/Perplexity=36,000\\n    "
        "throughput/total_tokens=41,943,040"
    ),
    (
        "2023-01-01,10:00:00 | INFO | Train Epoch: 0 [  {j}/10000000 (0%)] Data (t): 0.100 Batch "
        "(t): 1.000, 1000.00/s, 100.000/s/gpu LR: 0.000001 Logit Scale: 14.286 Contrastive_loss: "
        "{v} ({v}) Loss: {v} ({v})"
    ),
    (
        "Epoch: [0]  [{j:4d}/5000]  eta: 1:00:00  lr: 0.000001  wd: 0.040000  loss: {v} ({v})  "
        "time: 0.5000  data: 0.0100  max mem: 10000"
    ),
    (
        "[2021-01-01 10:00:00 swin_tiny] (main.py 200): INFO Train: [0/300][{j}/5000]\teta "
        "1:00:00 lr 0.000001\ttime 0.5000 (0.5000)\tloss {v} ({v})\tgrad_norm 1.0000 (1.0000)\tmem "
        "5000MB"
    ),
    (
        "Epoch: [0]  [{j:4d}/7330]  eta: 1:00:00  lr: 0.000100  class_error: 100.00  loss: {v} "
        "({v})  loss_ce: 4.0000 (4.0000)  loss_bbox: 1.0000 (1.0000)  time: 0.5000  data: 0.0100 "
        " max mem: 5000"
    ),
    (
        "2020-12-03 09:33:21,487 - meter.py[line:34] - INFO: Epoch: [4][{j:4d}/6673]       Time  "
        "3.452 ( 0.811)    Loss {v} ({v})    Acc@1   {i}.00 (  0.10)   Acc@5   0.52 (  0.48)"
    ),
    "[{i}]:    train's l2:{v}    valid's l2:0.100327",
    "[20:01:02] [{i}]  test-error:0.027200 train-error:{v}",
    "[Epoch {i}/200] [Batch {j}/938] [D loss: 0.5] [G loss: {v}]",
    (
        "2020-11-14 23:12:55,685-INFO: epoch: 0, iter: {j}, lr: 0.001000, 'loss': {v}, 'acc': 0.{i:02d}, "
        "time: 57.479"
    ),
    "Epoch: {i:04d} train_loss= {v} train_acc= 0.{i:02d}00 test_acc= 0.{i:02d}50",
    "episode {i} score {v} average score {v}",
    "Current loss is: {v}, Iteration: {i}",
    " Epoch[ 1 of 30]-Minibatch[{j:5d}-{k:5d}0]: ce = {v} * 500; errs = 0.500% * 500; time = 1.6253s",
    "\titers: {j}, epoch: 1 | loss: {v}\n\tspeed: 0.0656s/iter; left time: 112.9150s",
    "Epoch: {i}, Steps: 384 | Train Loss: {v} Vali Loss: {v} Test Loss: {v}\nUpdating learning rate to 1e-05",
    "27 Nov 14:{i:02d}    INFO  epoch {i} training [time: 24.48s, train loss: {v}]",
    (
        "I20250104 12:12:42 90 dinov2 helpers.py:102] Training  [{j:7d}/2500000]  eta: 40 days, 13:22:08  "
        "lr: 0.0006 (0.0003)  total_loss: {v} (6.5000)  koleo_loss: 0.0315 (0.0316)  time: 1.363414"
    ),
    "2018-12-12 10:08:09,712 - root - INFO - The train loss of epoch1-batch-{j}:{v}",
    "Total rewards in episode {i} is {v} total number of steps are 3626",
    "I0912 11:40:27.956218 139735407601536 model_lib_v2.py:652] Step {j} per-step time 0.813s loss={v}",
    (
        "Epoch: [{i}] Total time: 0:00:41 (1.1597 s / it)\nAveraged stats: lr: 0.003596  min_lr: 0.003596  "
        "loss: {v} ({v})  class_acc: 0.{i:02d}34 (0.5078)\nAccuracy of the model on the 2297 test images: "
        "{i}.4%\nMax accuracy: {i}.36%"
    ),
    (
        "VLOG[1] (train-ctc-parallel:EvalParallel():ctc-loss.cc:182) After {j} sequences (1.5Hr): "
        "Obj(log[Pzx]) = -{v}   TokenAcc = {i}.5557%"
    ),
    (
        "Epoch : {i} - loss : {v} - acc: 0.{i:02d}94 - val_loss : {v} - val_acc: 0.{i:02d}31\n\n"
        "100%|██████████| 6/6 [00:09<00:00,  1.55s/it]\n  0%|          | 0/6 [00:00<?, ?it/s]"
    ),
    "epoch {k}: {v}",
    "Avg : g {v} d 0.0000 ad 0.0000| step {j}: 100%|██████████| 166/166 [05:01<00:00,  1.81s/it]",
]


def _write(tmp_path: Path, shape: str, values: list[str]) -> Path:
    path = tmp_path / "paste.log"
    lines = [
        shape.replace("\\t", "\t")
        .replace("\\n", "\n")
        .format(i=i, j=100 * i, k=10 * i, v=v, V=v.upper() if v == "nan" else v)
        for i, v in enumerate(values, 1)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("shape", SHAPES + FRAMEWORKS)
def test_a_nan_is_found_on_the_record_of_its_print(tmp_path: Path, shape: str) -> None:
    values = [f"{7.0 - 0.3 * i:.4f}" if i != 8 else "nan" for i in range(1, 13)]
    trace = read_log(_write(tmp_path, shape, values))
    steps = [s["step"] for s in trace.steps]
    assert len(steps) == 12
    found = [f for f in diagnose(trace) if f.type == "nonfinite"]
    assert found and found[0].step == steps[7]


@pytest.mark.parametrize("shape", SHAPES + FRAMEWORKS)
def test_a_healthy_run_printed_so_is_flagged_nothing(tmp_path: Path, shape: str) -> None:
    values = [f"{2.5 * math.exp(-i / 15) + 0.4 + 0.03 * math.sin(2.7 * i):.4f}" for i in range(1, 41)]
    found = [f for f in diagnose(read_log(_write(tmp_path, shape, values))) if f.severity != "info"]
    assert not found
