import torch

from mtl_cog.data.batches import BatchTransform, eval_batch_indices, random_crop, train_batch_indices
from mtl_cog.data.task_api import TaskSpec


def test_eval_shards_cover_every_sample_once_after_dedup():
    for n, world, bs in [(37, 2, 8), (10, 3, 4), (5, 1, 2), (1, 2, 4)]:
        seen = torch.cat([torch.cat(list(eval_batch_indices(n, bs, r, world))) for r in range(world)])
        assert sorted(set(seen.tolist())) == list(range(n))
        counts = [sum(len(b) for b in eval_batch_indices(n, bs, r, world)) for r in range(world)]
        assert len(set(counts)) == 1  # equal shards: one gather, no hang


def test_train_batches_partition_and_agree_across_processes():
    n, batch = 50, 16
    one = [b for b in train_batch_indices(n, batch, 0, 1, seed=3, epoch=1)]
    two = [list(zip(train_batch_indices(n, batch, 0, 2, 3, 1), train_batch_indices(n, batch, 1, 2, 3, 1)))]
    merged = [torch.sort(torch.cat(pair)).values for pair in two[0]]
    assert all(torch.equal(torch.sort(a).values, b) for a, b in zip(one, merged))
    assert set(torch.cat(one).tolist()) == set(range(n))
    different_epoch = torch.cat(list(train_batch_indices(n, batch, 0, 1, 3, 2)))
    assert not torch.equal(torch.cat(one), different_epoch)


def test_random_crop_shifts_content_and_keeps_shape():
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.uint8).view(2, 3, 8, 8)
    g = torch.Generator().manual_seed(0)
    out = random_crop(images, 2, g)
    assert out.shape == images.shape and out.dtype == torch.uint8
    # each output is a translated window of the zero-padded input
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    for i in range(2):
        assert any(torch.equal(out[i], padded[i, :, dy:dy + 8, dx:dx + 8]) for dy in range(5) for dx in range(5))


def test_transform_normalises_and_only_augments_train():
    spec = TaskSpec("x", ("a",), (2,), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), pad_crop=2, hflip=True)
    images = torch.full((4, 3, 8, 8), 128, dtype=torch.uint8)
    out = BatchTransform(spec, train=False)(images)
    assert torch.allclose(out, torch.full_like(out, (128 / 255 - 0.5) / 0.25))
    img = torch.randint(0, 255, (16, 3, 8, 8), dtype=torch.uint8)
    assert torch.equal(BatchTransform(spec, train=False)(img), BatchTransform(spec, train=False)(img))
    assert not torch.equal(BatchTransform(spec, train=True)(img), BatchTransform(spec, train=False)(img))
