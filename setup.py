import runpy

from setuptools import find_packages, setup


# transformers and accelerate: every release from the oldest tested to the next major (why no tighter upper bound, and
# which releases CI tests: adloco_hf/common/versions.py, read as a file because the package is not installed yet).
versions = runpy.run_path("adloco_hf/common/versions.py")
# torch is pinned for the CPU build that lies on this project's machines; any torch>=2.4 works for users.
install_requires = [
    "torch>=2.4",
    *versions["requirements"](),
    "datasets>=4.0",
    "safetensors>=0.4",
    "huggingface_hub>=1.0",
    "evaluate>=0.4",
    "tokenizers>=0.20",
    "pyyaml>=6.0",
    "matplotlib>=3.8",
]

extras = {
    # ruff is pinned: its formatter and rules change between releases and `make quality` runs in CI.
    # peft: tests/test_peft.py trains a LoRA adapter (pinned; it works with every supported transformers).
    # torchft: the round quorum's tests (tests/quorum/) run in CI.
    "dev": [
        "pytest>=8.0",
        "pytest-timeout>=2.3",
        "pytest-xdist==3.8.0",
        "ruff==0.17.6",
        "peft==0.21.2",
        "torchft==0.2.0",
    ],
    # use_liger_kernel=True: Liger's Triton kernels (CUDA only; pinned, tests/trainer/test_speed_levers.py checks that
    # AdLoCoTrainer applies the Trainer's patch, and on a GPU that it trains as the Trainer does with it).
    "gpu": ["liger-kernel==0.8.5"],
    # Live recovery's round quorum (adloco_hf/quorum/; pinned: adloco_hf/quorum/requirement.py names the release).
    "ft": ["torchft==0.2.0"],
}

setup(
    name="adloco_hf",
    version="0.1.0",
    description="AdLoCo (adaptive-batch, multi-instance DiLoCo) for the Hugging Face Trainer",
    url="https://github.com/adloco-hf/adloco_hf",  # the repository the model cards link to (reporting/model_card.py)
    project_urls={
        "Source": "https://github.com/adloco-hf/adloco_hf",
        "Documentation": "https://github.com/adloco-hf/adloco_hf/tree/main/docs",
        "Issues": "https://github.com/adloco-hf/adloco_hf/issues",
        "Paper": "https://arxiv.org/abs/2508.18182",
    },
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["adloco_hf", "adloco_hf.*"]),
    package_data={"adloco_hf": ["metrics/*.py"]},
    python_requires=">=3.10",
    install_requires=install_requires,
    extras_require=extras,
    # `adloco-hf summary|plot|verify|export|push RUN`: what users do after training (adloco_hf/commands.py).
    entry_points={"console_scripts": ["adloco-hf = adloco_hf.cli:main"]},
)
