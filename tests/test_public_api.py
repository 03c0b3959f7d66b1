"""The public names and module paths from before the sub-packages keep working: every name
``engine`` exported, and the deep module paths users were shown (with a name each)."""
import importlib

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

# Deep paths and a name each was used for.
DEEP = {
    "engine.lr_scheduler": ["LambdaLR", "StepLR", "LinearLR", "CosineAnnealingLR",
                            "SequentialLR", "LRScheduler"],
    "engine.data": ["make_task", "load", "TASKS", "REGRESSION_OUTPUTS"],
    "engine.distributed": ["ShardedAdamW", "fit_setup", "save", "load"],
    "engine.callbacks": ["Callback", "EarlyStopping", "ModelCheckpoint", "check_output_path"],
    "engine.interop": ["to_torch_state_dict", "load_torch_state_dict", "torch_names"],
    "engine.train": ["fit", "evaluate", "predict", "History", "TrainingInterrupted",
                     "r2_score", "mean_absolute_error"],
    "engine.optim": ["SGD", "AdamW", "Optimizer", "clip_grad_norm", "defer_keyboard_interrupt"],
    "engine.checkpoint": ["save", "load", "CheckpointError"],
    "engine.module": ["Module", "Parameter", "Workspace"],
    "engine.layers": ["Linear", "MLP", "Activation", "Sequential"],
    "engine.blocks": ["FFN", "GMLP", "FFNSublayer", "LayerNorm"],
    "engine.losses": ["MSELoss", "CrossEntropyLoss"],
    "engine.registry": ["BLOCKS"],
    "engine.naive": ["NaiveBlock"],
    "engine.lm": ["build_model", "Vocabulary"],
    "engine.cli": ["main", "build_parser"],
}


@pytest.mark.parametrize("name", EXPORTS)
def test_every_old_export_is_still_there(name):
    # Check `from engine import X` works for each name exported before the split.
    assert getattr(engine, name) is not None


@pytest.mark.parametrize("path", sorted(DEEP))
def test_deep_paths_import_with_their_names(path):
    # Check `import engine.x` and `from engine.x import Y` work, and that an old path is the
    # same module object as the attribute (so monkeypatching through either reaches both).
    mod = importlib.import_module(path)
    for name in DEEP[path]:
        assert hasattr(mod, name), f"{path}.{name}"
    assert getattr(engine, path.split(".")[1]) is mod


def test_descriptive_names_of_the_two_gated_mlps():
    # Check the names that tell the two apart are the classes themselves: ChannelGatedMLP
    # (GMLP: gating within each token) and SpatialGMLPBlock (GMLPBlock: Liu et al.'s block,
    # gating across tokens).
    assert engine.ChannelGatedMLP is engine.GMLP
    assert engine.SpatialGMLPBlock is engine.GMLPBlock
    assert engine.ChannelGatedMLP is not engine.SpatialGMLPBlock


def test_old_paths_share_classes_with_new_ones():
    # Check a class reached through an old path is the one exported, not a copy.
    from engine.train import fit as old_fit
    from engine.training.loop import fit as new_fit
    assert old_fit is new_fit is engine.fit
    from engine.lr_scheduler import StepLR
    from engine.optim.lr_scheduler import StepLR as NewStepLR
    assert StepLR is NewStepLR


# Exports added since the split, each the object of its defining module.
ADDED = {"GPT": "engine.models.gpt", "generate": "engine.models.sampling",
         "load_model": "engine.training.load_model", "LoadedModel": "engine.training.load_model"}


@pytest.mark.parametrize("name", sorted(ADDED))
def test_added_exports_are_their_modules_objects(name):
    # Check `engine.X` is the object its module defines (e.g. engine.generate, the sampler
    # of both language models).
    assert getattr(engine, name) is getattr(importlib.import_module(ADDED[name]), name)
