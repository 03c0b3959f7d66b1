"""The public names keep working: every name ``engine`` exported before the sub-packages, and
the module paths users are shown (with a name each)."""
import importlib
import sys

import pytest

import engine

# engine/__init__.py's exports before engine/ was split into sub-packages.
EXPORTS = [
    "AdamW", "AddNorm", "Callback", "CheckpointError", "CrossEntropyLoss", "Dropout",
    "EarlyStopping", "Embedding", "FFN", "FFNSublayer", "GELU", "GMLP", "GMLPBlock", "GatedFFN",
    "History", "Identity", "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax", "MLP", "MSELoss",
    "ModelCheckpoint", "Module", "NonFiniteLossError", "Optimizer", "Parameter", "ReLU", "SGD",
    "Sequential", "SiLU", "Sigmoid", "Softmax", "SpatialGatingUnit", "Tanh", "Workspace",
    "clip_grad_norm", "data", "evaluate", "fit", "lm", "load", "load_torch_state_dict",
    "lr_scheduler", "predict", "save", "to_torch_state_dict",
]

# Module paths and a name each was used for (the modules' own paths: engine has no aliases).
DEEP = {
    "engine.optim.lr_scheduler": ["LambdaLR", "StepLR", "LinearLR", "CosineAnnealingLR",
                                  "SequentialLR", "LRScheduler"],
    "engine.data": ["make_task", "load", "TASKS", "REGRESSION_OUTPUTS"],
    "engine.distributed": ["ShardedAdamW", "fit_setup", "save", "load"],
    "engine.training.callbacks": ["Callback", "EarlyStopping", "ModelCheckpoint",
                                  "check_output_path"],
    "engine.interop": ["to_torch_state_dict", "load_torch_state_dict", "torch_names"],
    "engine.training.loop": ["fit", "evaluate", "predict", "History", "TrainingInterrupted"],
    "engine.training.metrics": ["r2_score", "mean_absolute_error"],
    "engine.optim": ["SGD", "AdamW", "Optimizer", "clip_grad_norm", "defer_keyboard_interrupt"],
    "engine.training.checkpoint": ["save", "load", "CheckpointError", "read_header"],
    "engine.nn.module": ["Module", "Parameter", "Workspace"],
    "engine.nn.layers": ["Linear", "Activation"],
    "engine.nn.containers": ["MLP", "Sequential"],
    "engine.nn.blocks": ["FFN", "FFNSublayer", "LayerNorm"],
    "engine.nn.losses": ["MSELoss", "CrossEntropyLoss"],
    "engine.models.registry": ["BLOCKS"],
    "engine.models.naive": ["NaiveBlock"],
    "engine.models.lm": ["build_model", "Vocabulary"],
    "engine.training.lm": ["setup", "train", "run_training", "LMSetup"],
    "engine.training.gpt_lm": ["GPTConfig", "build_model", "setup", "train"],
    "engine.cli": ["main", "build_parser"],
}

# Sub-modules that are also attributes of engine itself.
MODULE_ATTRIBUTES = {"data": "engine.data", "lm": "engine.training.lm",
                     "lr_scheduler": "engine.optim.lr_scheduler"}


@pytest.mark.parametrize("name", EXPORTS)
def test_every_old_export_is_still_there(name):
    # Check `from engine import X` works for each name exported before the split.
    assert getattr(engine, name) is not None


@pytest.mark.parametrize("path", sorted(DEEP))
def test_deep_paths_import_with_their_names(path):
    # Check `import engine.x.y` and `from engine.x.y import Z` work for the paths users are shown.
    mod = importlib.import_module(path)
    for name in DEEP[path]:
        assert hasattr(mod, name), f"{path}.{name}"


@pytest.mark.parametrize("name", sorted(MODULE_ATTRIBUTES))
def test_module_attributes_are_the_modules_themselves(name):
    # Check engine.lm (and the like) is the defining module, so monkeypatching through either
    # reaches the one module.
    assert getattr(engine, name) is importlib.import_module(MODULE_ATTRIBUTES[name])


# engine.lm's names before its training moved up from engine/models to engine/training.
LM_NAMES = ["TextConfig", "LMConfig", "LMSetup", "LMResult", "Vocabulary", "corpus", "split",
            "windows", "unigram_bits", "build_model", "bits_per_char", "sample", "setup", "train",
            "check_config", "print_result", "warmup_cosine", "corpus_data",
            "adamw_decaying_matrices", "run_training", "prepare"]


@pytest.mark.parametrize("name", LM_NAMES)
def test_engine_lm_keeps_every_name(name):
    # Check `engine.lm.X` still works for each name engine.lm exported (model and training
    # side alike), and the model side is the one object of engine/models/lm.py.
    assert callable(getattr(engine.lm, name))
    lower = importlib.import_module("engine.models.lm")
    if hasattr(lower, name):
        assert getattr(engine.lm, name) is getattr(lower, name)


# Old paths still served, each with why (engine/__init__.py).
KNOWN_ALIASES = {}


def test_no_module_is_imported_under_a_second_name():
    # Check no engine module sits in sys.modules under a path other than its own (an alias
    # gives one module two paths and keeps import cycles through the old one alive).
    importlib.import_module("engine.cli")
    aliased = {key: mod.__name__ for key, mod in list(sys.modules.items())
               if key.startswith("engine.") and getattr(mod, "__name__", key) != key}
    assert aliased == KNOWN_ALIASES


@pytest.mark.parametrize("old", ["engine.train", "engine.layers", "engine.checkpoint",
                                 "engine.blocks", "engine.registry"])
def test_pre_layout_paths_are_gone(old):
    # Check the module paths from before engine's sub-packages no longer import.
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_descriptive_names_of_the_two_gated_mlps():
    # Check the names that tell the two apart are the classes themselves: ChannelGatedMLP
    # (GMLP: gating within each token) and SpatialGMLPBlock (GMLPBlock: Liu et al.'s block,
    # gating across tokens).
    assert engine.ChannelGatedMLP is engine.GMLP
    assert engine.SpatialGMLPBlock is engine.GMLPBlock
    assert engine.ChannelGatedMLP is not engine.SpatialGMLPBlock


# Exports added since the split, each the object of its defining module.
ADDED = {"GPT": "engine.models.gpt", "generate": "engine.models.sampling",
         "load_model": "engine.training.load_model", "LoadedModel": "engine.training.load_model"}


@pytest.mark.parametrize("name", sorted(ADDED))
def test_added_exports_are_their_modules_objects(name):
    # Check `engine.X` is the object its module defines (e.g. engine.generate, the sampler
    # of both language models).
    assert getattr(engine, name) is getattr(importlib.import_module(ADDED[name]), name)
