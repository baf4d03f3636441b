"""The data sets the Gavel-MSR models train on, and how fast each job reads its data set.

Gavel's trace (stanford-futuredata/gavel, traces/msr) names each job's training command, and the
command names its data set (`--data_dir .../imagenet`, `.../cifar10`, `multi30k.atok.low.pt`,
`wikitext2`, `ml-20m`, `monet2photo`; A3C plays Pong and reads none). A job's IO demand at full
speed is its data set's size over the time one epoch takes at the throughput of Gavel's table:

    GB/s = steps/s x samples per step x (data set GB / samples in the data set)

with steps/s on consolidated V100s at the job's GPU count (the reference speed of the simulator's
work units) and samples per step = batch size x samples per batch item (35 tokens per sequence
for LM, a Monet and a photo per CycleGAN step). The table counts a multi-GPU job's steps as a
whole, so its batch size is the job's. DataCache (corral.core.cache) turns the demand into speeds.

Sizes are the training data a job reads; those marked ~ are estimates, the big one (ImageNet) is
not. Only ImageNet is larger than a few hundred MB, so in this workload the cache matters for the
ResNet-50 jobs (13 % of the jobs, 18 % of the GPU time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from corral.core.cluster import Cluster
from corral.core.job import JobSpec
from corral.sim.perfmodel import GAVEL_REFERENCE_TYPE, PerfModel

if TYPE_CHECKING:  # (the caches come with a run that has one: make_cache)
    from corral.core.cache import DataCache, DataRead, ReadsOf


@dataclass(slots=True, frozen=True)
class Dataset:
    size_gb: float  # 1 GB = 1e9 bytes
    samples: int  # training examples, in the unit a batch item is made of
    source: str


DATASETS: dict[str, Dataset] = {
    # ILSVRC2012 training set: 1,281,167 images (Russakovsky et al., "ImageNet Large Scale Visual
    # Recognition Challenge", IJCV 2015); the training archive is listed as 138 GB on
    # image-net.org; 140 GB here.
    "imagenet": Dataset(140.0, 1_281_167, "Russakovsky et al., IJCV 2015; image-net.org"),
    # 50,000 training images of 32x32 (Krizhevsky, "Learning Multiple Layers of Features from
    # Tiny Images", tech. report, 2009); the python version is 163 MB (cs.toronto.edu/~kriz/cifar).
    "cifar10": Dataset(0.163, 50_000, "Krizhevsky 2009; cs.toronto.edu/~kriz/cifar.html"),
    # 29,000 English-German training sentence pairs (Elliott et al., "Multi30K: Multilingual
    # English-German Image Descriptions", VL workshop 2016; the data of WMT16's multimodal
    # translation task). ~4 MB: our estimate, ~70 bytes per sentence in each language.
    "multi30k": Dataset(0.004, 29_000, "Elliott et al., VL 2016 (WMT16 multimodal task)"),
    # 2,088,628 training tokens (Merity et al., "Pointer Sentinel Mixture Models", ICLR'17, the
    # statistics of WikiText); ~11 MB of text.
    "wikitext2": Dataset(0.011, 2_088_628, "Merity et al., ICLR 2017"),
    # 20,000,263 ratings by 138,493 users (Harper and Konstan, "The MovieLens Datasets: History
    # and Context", ACM TiiS 2015); ~0.5 GB of ratings. The autoencoder's example is one user.
    "ml20m": Dataset(0.5, 138_493, "Harper & Konstan, ACM TiiS 2015"),
    # 1,072 Monet paintings and 6,287 photos for training (Zhu et al., "Unpaired Image-to-Image
    # Translation using Cycle-Consistent Adversarial Networks", ICCV'17, data set release);
    # ~0.3 GB.
    "monet2photo": Dataset(0.3, 7_359, "Zhu et al., ICCV 2017"),
}

#: model family (the job type before " (batch size N)") -> (data set, samples per batch item);
#: None: the model reads no data set (A3C generates its experience from the Atari emulator).
MODEL_DATA: dict[str, tuple[str, int] | None] = {
    "ResNet-50": ("imagenet", 1),
    "ResNet-18": ("cifar10", 1),
    "Transformer": ("multi30k", 1),
    "LM": ("wikitext2", 35),  # sequences of 35 tokens (bptt of PyTorch's word_language_model)
    "Recommendation": ("ml20m", 1),
    "CycleGAN": ("monet2photo", 2),  # batch size 1 (the script's default): one image of each set
    "A3C": None,
}

_JOB_TYPE = re.compile(r"(?P<family>.+?) \(batch size (?P<batch>\d+)\)")


def data_of(model: str) -> tuple[str, int, int] | None:
    """(data set, batch size, samples per batch item) of a Gavel job type; None if it reads none
    or is not a Gavel model."""
    match = _JOB_TYPE.fullmatch(model)
    family, batch = (match["family"], int(match["batch"])) if match else (model, 1)
    entry = MODEL_DATA.get(family)
    if entry is None:
        return None
    return entry[0], batch, entry[1]


#: "shared": every job of a model reads the one data set of MODEL_DATA (as the trace's commands
#: say); "per-vc": each virtual cluster (team) reads its own copy of it (a data set of the same
#: size named `imagenet@<vc>`), the way teams train on their own data in a shared cluster.
DATASET_SCOPES = ("shared", "per-vc")


def reads_for(perf: PerfModel, scope: str = "shared") -> ReadsOf:
    """What a job reads, from its model and GPU count (None for models not in MODEL_DATA)."""
    from corral.core.cache import DataRead

    @lru_cache(maxsize=1024)
    def read(model: str, gpus: int) -> DataRead | None:
        data = data_of(model)
        steps_s = perf.throughput(model, gpus, GAVEL_REFERENCE_TYPE)
        if data is None or steps_s is None:
            return None
        name, batch, per_item = data
        dataset = DATASETS[name]
        gb_s = steps_s * batch * per_item * dataset.size_gb / dataset.samples
        return DataRead(name, dataset.size_gb, gb_s / gpus)

    def reads(spec: JobSpec) -> DataRead | None:
        data = read(spec.model, spec.gpus) if spec.model else None
        if data is None or scope == "shared":
            return data
        return replace(data, dataset=f"{data.dataset}@{spec.vc}")

    return reads


def make_cache(
    cluster: Cluster,
    perf: PerfModel,
    *,
    cache_gb_per_node: float,
    storage_gbps: float,
    policy: str,
    scope: str = "shared",
) -> DataCache:
    """Node caches of `cache_gb_per_node` GB, `storage_gbps` Gbit/s of remote IO per node."""
    from corral.core.cache import DataCache

    return DataCache(
        cluster,
        capacity_gb_per_node=cache_gb_per_node,
        storage_gb_s_per_node=storage_gbps / 8.0,
        reads=reads_for(perf, scope),
        policy=policy,
    )


def cache_line(summary: dict[str, object]) -> str:
    """One printed line of a run's cache statistics (DataCache.summary, in summary.json)."""
    hit, speed, stall = (
        summary.get(k) for k in ("cache_hit_ratio", "avg_speed", "first_epoch_stall_gpu_h")
    )
    options = summary.get("options")
    policy = options.get("cache_policy", "?") if isinstance(options, dict) else "?"
    return (
        f"{summary.get('policy')}/{summary.get('placement')}, cache {policy}: hit ratio "
        + (f"{hit:.1%}" if isinstance(hit, float) else "-")
        + ", avg speed "
        + (f"{speed:.3f}" if isinstance(speed, float) else "-")
        + ", first-epoch stalls "
        + (f"{stall:,.0f} GPU-h" if isinstance(stall, float) else "-")
    )
