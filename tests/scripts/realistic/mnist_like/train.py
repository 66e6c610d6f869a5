"""Classifier training in the style of pytorch/examples/mnist (main.py).

The model lives in model.py and the dataset in data.py, next to this file. Besides the
example's train()/test() pair it keeps the best model with ``torch.save(model, path)`` (the
whole module, pickled) whenever the test loss improves, and at the ``--snapshot-steps`` it
takes a ``copy.deepcopy`` of the model and a ``pickle.dumps`` of model, optimizer and
scheduler, printing a fingerprint of each copy.
"""
import argparse
import copy
import os
import pickle

import torch
import torch.nn.functional as F
import torch.optim as optim
from data import AddGaussianNoise, SyntheticDigits
from model import Net
from torch.optim.lr_scheduler import StepLR


def param_sum(model):
    return sum(p.detach().sum().item() for p in model.parameters())


def take_snapshot(model, optimizer, scheduler, step):
    """Copy the training state the two ways scripts do (an EMA/"best" copy, a pickled checkpoint)."""
    copied = copy.deepcopy(model)
    blob = pickle.dumps({"model": model, "optimizer": optimizer, "scheduler": scheduler})
    restored = pickle.loads(blob)
    opt_state = restored["optimizer"].state_dict()["state"]
    square_avg = sum(s["square_avg"].sum().item() for s in opt_state.values())
    print(f"Snapshot after step {step}: deepcopy {param_sum(copied):.6f} | "
          f"pickled model {param_sum(restored['model']):.6f} | "
          f"optimizer square_avg {square_avg:.6f} | "
          f"scheduler lr {restored['scheduler'].get_last_lr()[0]:.6f}")


def train(args, model, device, train_loader, test_loader, optimizer, scheduler, epoch, state):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        state["step"] += 1
        if batch_idx % args.log_interval == 0:
            print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
        if state["step"] in args.snapshot_steps:
            take_snapshot(model, optimizer, scheduler, state["step"])
        if args.eval_every and state["step"] % args.eval_every == 0:
            test(model, device, test_loader)
            model.train()
        if args.dry_run:
            break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print("\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n".format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
    return test_loss


def main():
    # Training settings
    parser = argparse.ArgumentParser(description="PyTorch MNIST-like Example")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N",
                        help="input batch size for training (default: 64)")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N",
                        help="input batch size for testing (default: 1000)")
    parser.add_argument("--epochs", type=int, default=2, metavar="N",
                        help="number of epochs to train (default: 2)")
    parser.add_argument("--train-size", type=int, default=6000, metavar="N",
                        help="number of synthetic training images (default: 6000)")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR",
                        help="learning rate (default: 1.0)")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M",
                        help="Learning rate step gamma (default: 0.7)")
    parser.add_argument("--dry-run", action="store_true",
                        help="quickly check a single pass")
    parser.add_argument("--seed", type=int, default=1, metavar="S",
                        help="random seed (default: 1)")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N",
                        help="how many batches to wait before logging training status")
    parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                        help="also evaluate every N steps (default: 0, only after each epoch)")
    parser.add_argument("--num-workers", type=int, default=2, metavar="N",
                        help="DataLoader worker processes (default: 2)")
    parser.add_argument("--snapshot-steps", type=lambda s: {int(v) for v in s.split(",") if v}, default="1,3,64,100",
                        help="comma-separated global steps after which to deepcopy and pickle the training state")
    parser.add_argument("--out-dir", default=".",
                        help="where to write best_model.pt (and mnist_cnn.pt with --save-model)")
    parser.add_argument("--save-model", action="store_true",
                        help="also save the final state_dict as mnist_cnn.pt")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    train_kwargs = {"batch_size": args.batch_size, "shuffle": True}
    test_kwargs = {"batch_size": args.test_batch_size}
    if args.num_workers > 0:
        loader_kwargs = {"num_workers": args.num_workers, "persistent_workers": True}
        train_kwargs.update(loader_kwargs)
        test_kwargs.update(loader_kwargs)

    dataset1 = SyntheticDigits(train=True, size=args.train_size, transform=AddGaussianNoise(0.1))
    dataset2 = SyntheticDigits(train=False)
    train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    os.makedirs(args.out_dir, exist_ok=True)
    best_path = os.path.join(args.out_dir, "best_model.pt")
    best_loss = float("inf")
    state = {"step": 0}
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, test_loader, optimizer, scheduler, epoch, state)
        test_loss = test(model, device, test_loader)
        scheduler.step()
        if test_loss < best_loss:
            best_loss = test_loss
            torch.save(model, best_path)
            print(f"Saved best model (test loss {best_loss:.4f}) to best_model.pt")

    best = torch.load(best_path, weights_only=False)
    print(f"Best model: parameter sum {param_sum(best):.6f}")
    if args.save_model:
        torch.save(model.state_dict(), os.path.join(args.out_dir, "mnist_cnn.pt"))
    print("done")


if __name__ == "__main__":
    main()
