"""Tests of course_utils.workload.train: the single-process loop later chapters build on."""

import pytest
import torch

from course_utils.data_parallel.gil import one_torch_thread
from course_utils.workload import data, metrics, train
from course_utils.workload.models import DLRM

pytestmark = pytest.mark.chapter(1)

CARDS = [3, 16, 100, 400]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Every test here on one torch thread, as a rank has; the tests after this module get their
    thread count back. For the whole module: torch's worker threads, once woken by a test on
    several threads, spin on for a while and add their CPU time to the next test's steps."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def logs():
    return data.make_click_logs(24000, seed=0, cardinalities=CARDS, n_dense=4)


def make_model(seed=0):
    return DLRM(CARDS, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,), seed=seed)


def run(logs, **kw):
    model = make_model()
    train_part, test_part = logs.split(0.75)
    hist = train.train(model, train_part, epochs=2, batch_size=512, lr=0.01, eval_data=test_part, **kw)
    return model, hist


def test_training_learns_most_of_the_signal(logs):
    _, hist = run(logs)
    bayes = logs.split(0.75)[1].bayes_auc()
    assert len(hist.epochs) == 2 and hist.samples == 2 * 18000
    assert hist.final["auc"] > 0.5 + 0.6 * (bayes - 0.5), (hist.final, bayes)
    assert hist.final["auc"] <= bayes + 0.02
    assert hist.epochs[-1]["train_loss"] < hist.epochs[0]["train_loss"]


def test_training_is_deterministic_given_the_seed(logs):
    model_a, a = run(logs)
    model_b, b = run(logs)
    assert a.step_loss == b.step_loss and a.epochs == b.epochs
    assert all(torch.equal(p, q) for p, q in zip(model_a.parameters(), model_b.parameters(), strict=False))
    _, c = run(logs, seed=1)
    assert c.step_loss != a.step_loss


def test_train_prints_nothing_unless_asked(logs, capsys):
    _, hist = run(logs)
    assert capsys.readouterr().out == ""
    run(logs, verbose=True)
    assert capsys.readouterr().out.strip() == hist.summary()
    assert hist.summary().splitlines()[0].startswith("epoch 1 | train loss ")
    first = hist.epochs[0]  # the summary holds the deterministic figures only, no timings
    assert hist.summary().splitlines()[0] == (
        f"epoch 1 | train loss {first['train_loss']:.3f} | "
        f"auc {first['auc']:.3f} | logloss {first['logloss']:.3f}"
    )


def test_train_step_lowers_the_loss_on_a_fixed_batch(logs):
    model = make_model()
    opt = train.make_optimizer(model, "adam", lr=0.01)
    batch = logs[:256].to_torch()
    losses = [train.train_step(model, opt, batch) for _ in range(30)]
    assert losses[-1] < 0.8 * losses[0]


def test_evaluate_agrees_with_metrics(logs):
    model = make_model()
    part = logs[:3000]
    probs = train.predict(model, part, batch_size=700)
    assert probs.shape == (3000,) and ((probs > 0) & (probs < 1)).all()
    result = train.evaluate(model, part)
    assert result["auc"] == pytest.approx(metrics.auc(part.label, probs), abs=1e-6)
    assert result["logloss"] == pytest.approx(metrics.logloss(part.label, probs), rel=1e-6)
    assert model.training  # predict restores the mode


def test_optimizers_by_name_and_by_object(logs):
    for name in ("sgd", "sgd_momentum", "adagrad", "adam", "adamw"):
        assert isinstance(train.make_optimizer(make_model(), name, 0.01), torch.optim.Optimizer)
    with pytest.raises(ValueError, match="unknown optimizer"):
        train.make_optimizer(make_model(), "lion")
    model = make_model()
    hist = train.train(model, logs[:2000], optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert len(hist.step_loss) == 2 and hist.epochs[0].keys() == {"epoch", "train_loss"}
    with pytest.raises(ValueError, match="epochs"):
        train.train(model, logs[:100], epochs=0)


def test_history_times_every_step_in_wall_and_cpu_time(logs):
    _, hist = run(logs)
    steps = len(hist.step_loss)
    assert len(hist.step_seconds) == len(hist.step_cpu_seconds) == steps
    assert all(cpu > 0 for cpu in hist.step_cpu_seconds)
    # one thread: a step cannot use more CPU time than the wall time it spans (clock resolution aside)
    assert all(cpu <= wall + 2e-3 for cpu, wall in zip(hist.step_cpu_seconds, hist.step_seconds, strict=True))
    assert sum(hist.step_cpu_seconds) <= hist.cpu_seconds
