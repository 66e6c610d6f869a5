"""One printed line to metrics (ptdash.printparse), on lines real training scripts print.

The lines are as the public scripts print them (format strings filled in as they run):
PyTorch's examples (mnist, imagenet, word_language_model, reinforcement_learning, dcgan),
nanoGPT and minGPT, the Hugging Face Trainer (its log dicts, its metrics block, its
TrainingArguments), Lightning (progress bars, checkpoint and summary lines), Keras-style loops
and tqdm bars; then the lines of the same scripts that hold numbers and no metric.
"""

from __future__ import annotations

import pytest

from ptdash import printparse
from ptdash.printparse import is_metric, parse, skipped

FOUND = [
    # nanoGPT train.py: the eval line, the iteration line (time and mfu are not metrics)
    ("step 0: train loss 4.2874, val loss 4.2823", [("train_loss", 4.2874), ("val_loss", 4.2823)]),
    ("iter 0: loss 4.2764, time 12321.43ms, mfu -100.00%", [("loss", 4.2764)]),
    ("iter 100: loss 2.1983, time 30.12ms, mfu 12.34%", [("loss", 2.1983)]),
    # minGPT chargpt.py
    ("iter_dt 7797.46ms; iter 2: train loss 2.60938", [("train_loss", 2.60938)]),
    # pytorch/examples word_language_model: table rows of pairs; lr and ms/batch are not metrics
    ("| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 11.43 | loss  7.64 | ppl  2079.22",
     [("loss", 7.64), ("ppl", 2079.22)]),
    ("| end of epoch   1 | time: 36.93s | valid loss  5.53 | valid ppl   252.86",
     [("valid_loss", 5.53), ("valid_ppl", 252.86)]),
    ("| End of training | test loss  4.65 | test ppl   104.71", [("test_loss", 4.65), ("test_ppl", 104.71)]),
    # pytorch/examples mnist: the line's first word names the data; 9890/10000 (99%) is 99
    ("Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.292776", [("train_loss", 0.292776)]),
    ("Test set: Average loss: 0.0336, Accuracy: 9890/10000 (99%)",
     [("test_average_loss", 0.0336), ("test_accuracy", 99.0)]),
    # pytorch/examples imagenet: ProgressMeter's current values, then the averages in brackets
    ("Epoch: [0][  10/5005]\tTime  0.123 ( 0.234)\tData  0.001 ( 0.002)\tLoss 6.9003e+00 (6.9103e+00)"
     "\tAcc@1   0.00 (  0.28)\tAcc@5   0.39 (  1.39)", [("loss", 6.9003), ("acc@1", 0.0), ("acc@5", 0.39)]),
    (" *   Acc@1 76.130 Acc@5 92.862", [("acc@1", 76.13), ("acc@5", 92.862)]),
    # pytorch/examples reinforcement_learning/reinforce.py
    ("Episode 10\tLast reward: 9.00\tAverage reward: 10.68", [("last_reward", 9.0), ("average_reward", 10.68)]),
    # pytorch/examples dcgan: D(x) is no metric's name
    ("[0/25][0/782] Loss_D: 1.8040 Loss_G: 5.3422 D(x): 0.6247 D(G(z)): 0.6266 / 0.0068",
     [("loss_d", 1.804), ("loss_g", 5.3422)]),
    # the Hugging Face Trainer's log lines (Python dicts) and its metrics block
    ("{'loss': 0.3412, 'grad_norm': 1.2345, 'learning_rate': 4.5e-05, 'epoch': 0.15}", [("loss", 0.3412)]),
    ("{'eval_loss': 0.2913, 'eval_accuracy': 0.9712, 'eval_runtime': 1.2123, 'eval_samples_per_second': 800.12, "
     "'eval_steps_per_second': 25.01, 'epoch': 0.15}", [("eval_loss", 0.2913), ("eval_accuracy", 0.9712)]),
    ("{'train_runtime': 12.3481, 'train_samples_per_second': 100.012, 'train_steps_per_second': 12.5, "
     "'train_loss': 0.3501, 'epoch': 3.0}", [("train_loss", 0.3501)]),
    ("{'eval_loss': 0.52, 'eval_matthews_correlation': 0.5632, 'eval_runtime': 0.9, 'epoch': 1.0}",
     [("eval_loss", 0.52), ("eval_matthews_correlation", 0.5632)]),
    ("{'exact_match': 80.93, 'f1': 88.24}", [("exact_match", 80.93), ("f1", 88.24)]),
    ("  eval_loss               =     0.0364", [("eval_loss", 0.0364)]),
    ("  best_eval_f1 = 0.9607", [("best_eval_f1", 0.9607)]),
    # JSON lines (fairseq's json log prints its numbers as strings)
    ('{"epoch": 1, "train_loss": "2.3", "valid_loss": "2.41", "wps": "12000"}',
     [("train_loss", 2.3), ("valid_loss", 2.41)]),
    ('{"step": 100, "loss": 2.31, "val_loss": NaN}', [("loss", 2.31), ("val_loss", None)]),
    # Lightning's progress bar: its postfix pairs, names with a slash, _step and _epoch
    ("Epoch 9: 100%|███████| 860/860 [00:05<00:00, 162.25it/s, v_num=1, train_loss_step=1.460, "
     "valid_loss_step=1.460, valid_loss_epoch=1.520, valid_acc=0.946, train_loss_epoch=1.510]",
     [("train_loss_step", 1.46), ("valid_loss_step", 1.46), ("valid_loss_epoch", 1.52), ("valid_acc", 0.946),
      ("train_loss_epoch", 1.51)]),
    ("Epoch 0:   1%|          | 1/115 [00:02<05:40,  0.33it/s, v_num=0, train/loss_step=12.90]",
     [("train/loss_step", 12.9)]),
    # a tqdm bar's postfix and description
    ("100%|██████████| 20/20 [00:01<00:02, 9.1it/s, val_mse=0.22, top1=0.6]", [("val_mse", 0.22), ("top1", 0.6)]),
    ("Loss=4.011697769165039 Batch_id=300 Accuracy=6.92: 100%|██████████| 301/301 [02:38<00:00,  1.89it/s]",
     [("loss", 4.011697769165039), ("accuracy", 6.92)]),
    # Keras-style epoch lines: the steps, seconds and ms/step between are not metrics
    ("8/8 - 0s - loss: 0.0258 - val_rmse: 0.040", [("loss", 0.0258), ("val_rmse", 0.04)]),
    ("128/128 - 5s - loss: 3.1494 - accuracy: 0.1463 - 5s/epoch - 43ms/step", [("loss", 3.1494), ("accuracy", 0.1463)]),
    ("469/469 [==============================] - 3s 6ms/step - loss: 0.2917 - accuracy: 0.9157 - val_loss: 0.1415 "
     "- val_accuracy: 0.9577", [("loss", 0.2917), ("accuracy", 0.9157), ("val_loss", 0.1415),
                                ("val_accuracy", 0.9577)]),
    # table rows, and the issue's own mixed line
    ("| step 30 | valid loss 0.0315 | valid acc 0.96 |", [("valid_loss", 0.0315), ("valid_acc", 0.96)]),
    ("epoch 3 | train loss 0.37 | val_loss=0.462 acc: 0.10", [("train_loss", 0.37), ("val_loss", 0.462),
                                                               ("acc", 0.1)]),
    # a first word that starts the first metric's name names only that metric
    ("train loss 0.37 | acc 0.1", [("train_loss", 0.37), ("acc", 0.1)]),
    ("val_loss=0.5 acc=0.9", [("val_loss", 0.5), ("acc", 0.9)]),
    # ptdash's own demo (engine/demo/train.py)
    ("eval step 200 | val loss 2.2921", [("val_loss", 2.2921)]),
    ("step 190 | loss 2.4419 | lr 3.0e-03 | 21 ms/step", [("loss", 2.4419)]),
    # a logging prefix's date and time are not read; percentages of a metric are its value
    ("2024-01-01 12:00:00,123 - INFO - Epoch 3 - loss: 0.3", [("loss", 0.3)]),
    ("Epoch 10 loss 12.3880 | train 2.1s | Acc 9.32% | infer 4.4s", [("loss", 12.388), ("acc", 9.32)]),
    ("Dataset Size: 1%, Epoch: 1, Train Loss: 11.004348516464233, Val Loss: 10.997926981021196",
     [("train_loss", 11.004348516464233), ("val_loss", 10.997926981021196)]),
    ("test roc auc :  0.716668545259525", [("test_roc_auc", 0.716668545259525)]),
    ("loss: nan", [("loss", None)]),
    ("kl=1.2e-3 elbo=-103.4 recon loss: 98.1", [("kl", 0.0012), ("elbo", -103.4), ("recon_loss", 98.1)]),
]

NOTHING = [
    # the same scripts' set-up and bookkeeping lines
    "Namespace(batch_size=64, epochs=14, lr=1.0, gamma=0.7, no_cuda=False, seed=1, log_interval=10, loss_weight=0.5)",
    "TrainingArguments(",
    "eval_delay=0,",
    "learning_rate=5e-05,",
    "    learning_rate: 0.0005",
    "    weight_decay: 0.1",
    "    grad_norm_clip: 1.0",
    "    batch_size: 64",
    "number of parameters: 124.44M",
    "tokens per iteration will be: 491,520",
    "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)",
    "Total params: 11,689,512",
    "1.0 M     Trainable params",
    "4.104     Total estimated model params size (MB)",
    "Seed set to 42",
    "GPU available: True (cuda), used: True",
    "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]",
    # counters, timings, rates, learning rates, progress
    "Epoch 1/10",
    "step 30 | epoch 2 | iter 400",
    "  train_runtime            = 2:01:44.85",
    "  eval_runtime            = 0:00:42.21",
    "  train_samples           =      25000",
    "  train_samples_per_second =     57.664",
    "lr: 0.001",
    "Learning rate: 1.0e-03",
    "Epoch 00012: reducing learning rate of group 0 to 1.0000e-04.",
    "elapsed time: 12.3 s, eta 0:01:02",
    "  5%|▌         | 10/200 [00:01<00:19,  9.83it/s]",
    "Epoch 0:   4%|▍         | 350/8000 [00:09<03:23, 37.56it/s, v_num=0]",
    "Validation DataLoader 0: 100%|██████████| 8/8 [00:00<00:00, 40.12it/s]",
    "Downloading: 45%|████▌     | 45.0M/100M [00:03<00:04, 13.1MB/s]",
    "{'train_runtime': 12.3, 'train_samples_per_second': 100.0, 'epoch': 3.0}",
    # sentences around a metric's name, checkpoint names and paths
    "Epoch 2, global step 300: 'val_loss' reached 0.30000 (best 0.30000), saving model to "
    "'/ckpt/epoch=2-step=300-val_loss=0.30.ckpt' as top 1",
    "Epoch 5: val_loss did not improve from 0.59",
    "Validation loss decreased (0.6923 --> 0.5913).  Saving model ...",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "Saving to checkpoints/model_loss_0.32.pt",
    "saving checkpoint to out-shakespeare-char/ckpt_loss=2.31.pt",
    # versions, dates, numbers inside words
    "torch 2.1.0 python 3.11.4 loss 2.1.0",
    "2024-03-01 10:22:33 | run 7",
    "resnet50 gpt2 bert-base-uncased-v2 top5error",
    "acc1 9890/10000",
]


@pytest.mark.parametrize("line,expected", FOUND, ids=[f[0][:40] for f in FOUND])
def test_real_lines_give_their_metrics(line, expected):
    assert not skipped(line)
    found = parse(line)
    assert [name for name, _ in found] == [name for name, _ in expected]
    for (_, got), (_, want) in zip(found, expected):
        assert got == pytest.approx(want) if want is not None else got is None


@pytest.mark.parametrize("line", NOTHING, ids=[n[:40] for n in NOTHING])
def test_lines_with_numbers_and_no_metric_give_nothing(line):
    assert skipped(line) or parse(line) == []


def test_source_lines_of_a_traceback_or_a_warning_are_not_read():
    frame = '  File "/home/u/train.py", line 42, in <module>'
    warned = "/home/u/train.py:17: UserWarning: the loss is small"
    source = "    loss = 0.5 * criterion(out)"
    assert parse(source) == [("loss", 0.5)]  # alone, it reads as a metric: its context says otherwise
    assert skipped(source, frame) and skipped("  loss = 0.5 * x", warned)
    assert not skipped("loss 0.5", "step 3 | loss 0.6")


def test_a_line_too_long_is_not_read():
    assert skipped("loss 0.5 " + "x" * printparse.MAX_LINE)


def test_names_that_are_metrics_and_names_that_are_not():
    for name in ["loss", "val_loss", "train/loss_step", "acc@1", "top5", "valid_ppl", "lossd", "eval_f1", "mae"]:
        assert is_metric(name), name
    for name in ["lr", "learning_rate", "epoch", "step", "time", "loss_weight", "loss_scale", "samples_per_second",
                 "eval_pearsonr", "grad_norm", "mfu", "accumulation"]:
        assert not is_metric(name), name
    # a dict's key with a split first is a metric, unless it is a counter or a timing
    assert is_metric("eval_pearsonr", structured=True)
    for name in ["eval_samples", "train_steps_per_second", "eval_runtime", "eval_delay", "train_batch_size"]:
        assert not is_metric(name, structured=True), name


def test_terminal_escapes_and_backspaces_are_cleaned():
    assert parse(printparse.clean("\x1b[32mloss\x1b[0m: 0.25 \x1b[1Aval_acc=0.9")) == [("loss", 0.25),
                                                                                      ("val_acc", 0.9)]
    assert printparse.clean("8/8\b\b\b - loss: 0.1") == "8/8 - loss: 0.1"


def test_a_dict_that_does_not_parse_is_read_as_text():
    assert parse("{'loss': tensor(0.31), 'val_loss': 0.4}") == [("val_loss", 0.4)]
    assert parse("{'loss': 10**400}") == []  # not a literal: read as text, where 10 is followed by '*'
    assert parse("{'loss': " + "9" * 400 + "}") == [("loss", None)]  # an int beyond a float
