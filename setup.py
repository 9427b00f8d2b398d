from setuptools import find_packages, setup


# torch is pinned for the CPU build that lies on this project's machines; any torch>=2.4 works for users.
install_requires = [
    "torch>=2.4",
    "transformers==5.23.0",
    "accelerate==1.15.0",
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
    # peft: tests/test_peft.py trains a LoRA adapter (pinned to the release tested with transformers 5.23).
    "dev": ["pytest>=8.0", "pytest-timeout>=2.3", "ruff==0.17.6", "peft==0.21.2"],
}

setup(
    name="adloco_hf",
    version="0.1.0",
    description="AdLoCo (adaptive-batch, multi-instance DiLoCo) for the Hugging Face Trainer",
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
