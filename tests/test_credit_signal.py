"""`python -m benchmarks credit-signal`: the policy-gradient signal each advantage mode gives reading the hints on
real GuessTheNumber episodes, and its control (hints that say nothing) near zero."""

from __future__ import annotations

from benchmarks.credit_signal import Config, measure


def test_reading_is_credited_and_the_control_is_not():
    cfg = Config(reads="0.5", batches=30, episodes=16, group_size=8)
    rows = {(r["mode"], r["balance"]): r for r in measure(cfg)}
    control = {(r["mode"], r["balance"]): r for r in measure(Config(reads="0.5", batches=30, episodes=16, group_size=8,
                                                                      control=True))}
    for key, r in rows.items():
        assert r["mean"] > 0 and r["snr"] > 0.3, key  # reading wins more: every mode pushes it up
        assert abs(control[key]["snr"]) < r["snr"] / 2, key  # hints that say nothing: no push either way
        assert 0 < r["first_push"] < 1, key  # winning first guesses pull their numbers up, bounded
    assert 0.45 < rows["group", False]["success"] < 0.7  # half the turns read (a reader alone wins ~0.76)
    assert control["group", False]["success"] < 0.45  # near the blind 0.40


def test_a_group_of_one_leaves_only_the_batch_baseline():
    """Groups of 1 (one hidden number an episode): the group-relative modes have nothing to compare a return with
    and give no signal (not a division by zero); the batch baseline still credits reading."""
    rows = {(r["mode"], r["balance"]): r for r in measure(Config(reads="0.5", batches=10, episodes=16, group_size=1))}
    for mode in ("group_norm", "group_episode", "gigpo"):
        assert rows[mode, False]["mean"] == 0 and rows[mode, False]["snr"] == 0, mode
    assert rows["batch_norm", False]["mean"] > 0
