"""A stand-in for torchvision's MNIST: ten noisy 28x28 glyphs, generated from a seeded generator
instead of downloaded, served through the usual Dataset interface with a transform."""
import torch
from torch.utils.data import Dataset

IMAGE_SIZE = 28


class AddGaussianNoise:
    """A random transform applied per sample, like the augmentations people add to MNIST."""

    def __init__(self, std=0.1):
        self.std = std

    def __call__(self, img):
        return img + torch.randn_like(img) * self.std


class SyntheticDigits(Dataset):
    """`size` images of one of ten fixed random glyphs plus noise; the test split uses another seed."""

    def __init__(self, train=True, size=None, transform=None):
        size = size if size is not None else (6000 if train else 1000)
        glyphs = torch.rand(10, 1, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1234)) > 0.7
        g = torch.Generator().manual_seed(0 if train else 1)
        self.targets = torch.randint(0, 10, (size,), generator=g)
        noise = torch.randn(size, 1, IMAGE_SIZE, IMAGE_SIZE, generator=g)
        self.data = glyphs[self.targets].float() + 0.8 * noise
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        img, target = self.data[index], int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        return img, target
