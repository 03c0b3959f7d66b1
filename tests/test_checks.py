"""One rule for bad arguments across the engine (engine/_checks.py): a value of the wrong
type is a TypeError, a value of the right type out of range is a ValueError, whichever
function is called; the command line's number options go through the same checks."""
import numpy as np
import pytest

from engine import SGD, EarlyStopping, Linear, MSELoss, data, fit
from engine.optim import lr_scheduler
from engine._checks import argparse_int, argparse_real, check_int, check_real
from engine.cli import main


def _fit(**kw):
    lin = Linear(2, 1, dtype=np.float64)
    X, Y = np.zeros((4, 2)), np.zeros((4, 1))
    options = dict(epochs=1, progress=False)
    options.update(kw)
    fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y, **options)


def _scheduler(**kw):
    lin = Linear(2, 1)
    return lr_scheduler.StepLR(SGD(lin.parameters(), lr=0.1), **kw)


# Each call gets a string where a number belongs (wrong type) and a number out of range.
CALLS = {
    "fit epochs": (lambda v: _fit(epochs=v), "3", -1),
    "fit batch_size": (lambda v: _fit(batch_size=v), "3", 0),
    "fit clip_grad_norm": (lambda v: _fit(clip_grad_norm=v), "1", -1.0),
    "EarlyStopping patience": (lambda v: EarlyStopping(patience=v), "3", -1),
    "EarlyStopping min_delta": (lambda v: EarlyStopping(min_delta=v), "0.1", -0.1),
    "StepLR step_size": (lambda v: _scheduler(step_size=v), "3", 0),
    "StepLR gamma": (lambda v: _scheduler(step_size=1, gamma=v), "0.5", -0.5),
    "data.regression n": (lambda v: data.regression(n=v), "3", 0),
    "data.train_val_split val_fraction": (
        lambda v: data.train_val_split(np.zeros((10, 2)), np.zeros(10), v), "0.2", 1.5),
    "Linear d_in": (lambda v: Linear(v, 2), "3", 0),
    "SGD lr": (lambda v: SGD(Linear(2, 1).parameters(), lr=v), "0.1", -0.1),
}


@pytest.mark.parametrize("what", sorted(CALLS))
def test_wrong_type_is_type_error_and_wrong_value_is_value_error(what):
    # Check the same kind of mistake gives the same exception class in every function.
    call, wrong_type, wrong_value = CALLS[what]
    with pytest.raises(TypeError):
        call(wrong_type)
    with pytest.raises(ValueError):
        call(wrong_value)
    with pytest.raises(TypeError):
        call(True)  # a bool is not a number or a size


def test_checks_name_the_argument_and_say_expected_and_got():
    # Check the message format: "<name>: expected <what>, got <value>".
    with pytest.raises(ValueError, match=r"^epochs: expected an integer >= 0, got -1$"):
        check_int("epochs", -1, 0)
    with pytest.raises(TypeError, match=r"^epochs: expected an integer >= 0, got '3' \(str\)$"):
        check_int("epochs", "3", 0)
    with pytest.raises(ValueError, match=r"^p: expected a finite number in \[0.0, 1.0\), got 1$"):
        check_real("p", 1, 0.0, 1.0, high_open=True)
    with pytest.raises(ValueError, match="nan"):
        check_real("x", float("nan"), finite=False)
    assert check_real("m", float("inf"), 0.0, low_open=True, finite=False) == float("inf")
    assert check_int("k", np.int64(3), 1) == 3 and type(check_int("k", np.int64(3), 1)) is int


def test_argparse_types_use_the_same_ranges():
    # Check the command line's types accept what the checks accept and reject the rest.
    import argparse
    assert argparse_int(1, "a positive integer")("4") == 4
    assert argparse_real(0.0, 1.0, "a number in (0, 1]", low_open=True)("1") == 1.0
    for parse, text in ((argparse_int(1, "x"), "0"), (argparse_int(1, "x"), "2.5"),
                        (argparse_real(0.0, 1.0, "x", low_open=True), "0"),
                        (argparse_real(0.0, None, "x"), "nan"),
                        (argparse_real(0.0, None, "x"), "inf")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"expected x, got '{text}'"):
            parse(text)


def test_cli_number_options_are_usage_errors(capsys):
    # Check a bad number on the command line exits with status 2 naming the option.
    with pytest.raises(SystemExit) as e:
        main(["train", "--epochs", "3.5"])
    assert e.value.code == 2
    assert "--epochs" in capsys.readouterr().err


def test_kernels_and_engine_share_one_copy_of_the_checks():
    # Check engine/_checks.py's number, flag and choice checks are kernels/checks.py's own
    # functions (kernels cannot import engine, so the one copy lives in kernels).
    from engine import _checks
    from kernels import checks
    for name in checks.__all__:
        assert getattr(_checks, name) is getattr(checks, name), name


@pytest.mark.parametrize("kwargs, error, text", [
    ({"lr": float("inf")}, ValueError, "lr: expected a finite number >= 0.0, got inf"),
    ({"beta1": 1.0}, ValueError, "beta1: expected a finite number in [0.0, 1.0)"),
    ({"step": True}, TypeError, "step: expected an int >= 1"),
    ({"zero_grad": 1}, TypeError, "zero_grad: expected True or False"),
])
def test_kernel_options_follow_the_shared_rule(kwargs, error, text):
    # Check kernels.adamw_update's options go through the shared checks (an infinite lr is
    # refused, a bool is not a step) and a refused call leaves the parameter unchanged.
    import kernels
    p, g = np.ones(4), np.full(4, 0.5)
    m, v = np.zeros(4), np.zeros(4)
    args = {"step": 1, "lr": 1e-3, **kwargs}
    with pytest.raises(error) as e:
        kernels.adamw_update(p, g, m, v, **args)
    assert str(e.value).startswith(text)
    assert np.array_equal(p, np.ones(4)) and not m.any() and not v.any()
