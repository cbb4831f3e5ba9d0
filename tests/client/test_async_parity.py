"""Drop-in parity with ``gymnasium.vector.AsyncVectorEnv``: the same misuse, side by side.

Every test runs the same thing on an ``AsyncVectorEnv`` (2 envs, ``shared_memory=False``) and
on a ``RemoteVectorEnv`` (2 envs on the session's pickle hosts, or on local hosts) and compares
exception types (``isinstance`` of Gymnasium's), messages where wording parity is wanted, and
results. Differences we keep on purpose (an env error leaves its env usable;
``context``/``daemon`` have no effect, ``worker``/``max_concurrency`` are refused;
``shared_memory`` is taken, for local hosts' large observations) are pinned as our own
behaviour, with the reason; docs/reference/compatibility.md lists them.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import vector as vector_wrappers
from helpers import assert_same

from envserver import client
from envserver.errors import RemoteEnvError

EPISODIC = "envserver.testing:envserver/Episodic-v0"
FAILING = "envserver.testing:envserver/Failing-v0"
CARTPOLE = functools.partial(gym.make, "CartPole-v1")
FRAMES = functools.partial(gym.make, EPISODIC, render_mode="rgb_array", max_steps=4)
SLOW = functools.partial(gym.make, EPISODIC, step_delay_s=1.0)
# A lambda travels by value (cloudpickle), so the hosts need not import this module.
SLOW_RESET = lambda: gym.wrappers.TransformObservation(  # noqa: E731
    gym.make("CartPole-v1"), lambda obs: (time.sleep(1.0), obs)[1], None
)
ACTIONS = np.array([0, 1])


@pytest.fixture
def make_pair(pickle_hosts) -> Iterator[Callable[..., tuple[AsyncVectorEnv, Any]]]:
    """Makes (AsyncVectorEnv, RemoteVectorEnv) of 2 envs from one factory; closes them after."""
    made: list[Any] = []

    def make(factory: Callable[[], gym.Env] = CARTPOLE, **kwargs: Any):
        reference = AsyncVectorEnv([factory] * 2, shared_memory=False, **kwargs)
        made.append(reference)
        remote = client.RemoteVectorEnv(
            [factory] * 2, hosts=pickle_hosts[:2], allow_pickle=True, **kwargs
        )
        made.append(remote)
        return reference, remote

    yield make
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for envs in made:  # ours politely, or the hosts keep the sessions (and hit their limit)
            envs.close(terminate=isinstance(envs, AsyncVectorEnv))


def outcome(envs: Any, action: Callable[[Any], Any]) -> tuple[str, Any]:
    """("ok", result) or ("raised", exception); Gymnasium's worker-error logs are silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", action(envs)
        except Exception as exc:
            return "raised", exc


def errors(pair: tuple[Any, Any], action: Callable[[Any], Any]) -> tuple[Exception, Exception]:
    """The exceptions ``action`` raises on the reference and on ours (both must raise)."""
    (kind_a, expected), (kind_r, actual) = outcome(pair[0], action), outcome(pair[1], action)
    assert kind_a == "raised", f"AsyncVectorEnv did not raise: {expected!r}"
    assert kind_r == "raised", f"RemoteVectorEnv did not raise (AsyncVectorEnv: {expected!r})"
    return expected, actual


def ours(message: str) -> str:
    return message.replace("AsyncVectorEnv", "RemoteVectorEnv")


def assert_same_error(expected: Exception, actual: Exception, message: str | None = "exact"):
    """Same type (ours may subclass Gymnasium's) and, as asked, the same message.

    ``message``: ``"exact"`` (the class name aside), ``"suffix"`` (ours prefixes where an env
    error happened: ``host ENDPOINT, env I: ``), or None (type only).
    """
    assert isinstance(actual, type(expected)), f"{actual!r} is not a {type(expected)}"
    if message == "exact":
        assert str(actual) == ours(str(expected))
    elif message == "suffix":
        assert str(actual).endswith(str(expected)), f"{actual} does not end with {expected}"
    for attribute in ("name",):  # AlreadyPendingCallError / NoAsyncCallError carry the state
        if hasattr(expected, attribute):
            assert getattr(actual, attribute) == getattr(expected, attribute)


def both(pair: tuple[Any, Any], action: Callable[[Any], Any]) -> tuple[Any, Any]:
    """Runs ``action`` on both; returns (ours, reference) for ``assert_same``."""
    results = []
    for envs in pair:
        kind, value = outcome(envs, action)
        if kind == "raised":
            raise value
        results.append(value)
    return results[1], results[0]


def rollout(envs: Any, steps: int = 8) -> list[Any]:
    results = [envs.reset(seed=3)]
    for t in range(steps):
        results.append(envs.step(np.array([t % 3, (t + 1) % 3])))
    return results


def ordered(value: Any) -> Any:
    """Dicts with sorted keys, recursively (for results whose key order may differ)."""
    if isinstance(value, dict):
        return {key: ordered(value[key]) for key in sorted(value)}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(ordered(v) for v in value)
    return value


# ---------------------------------------------------------------- constructor


@pytest.mark.parametrize(
    "mode", ["SameStep", AutoresetMode.DISABLED, "NextStep"], ids=["str", "enum", "default"]
)
def test_autoreset_mode_as_str_or_enum(make_pair, mode):
    pair = make_pair(autoreset_mode=mode)
    assert_same(*both(pair, lambda e: (e.autoreset_mode, e.metadata)))
    assert pair[1].metadata["autoreset_mode"] is AutoresetMode(mode)


@pytest.mark.parametrize("mode", ["bogus", 3, "samestep"])
def test_invalid_autoreset_mode(pickle_hosts, mode):
    expected = outcome(None, lambda _: AsyncVectorEnv([CARTPOLE] * 2, autoreset_mode=mode))[1]
    actual = outcome(None, lambda _: client.RemoteVectorEnv([CARTPOLE] * 2, autoreset_mode=mode))[1]
    assert_same_error(expected, actual)


SINGLE = gym.make("CartPole-v1").observation_space
BATCH = batch_space(SINGLE, 2)


@pytest.mark.parametrize(
    "mode",
    ["bogus", (SINGLE, SINGLE, SINGLE), [BATCH, SINGLE], (1, 2)],
    ids=["bogus-str", "3-tuple", "list-pair", "tuple-of-non-spaces"],
)
def test_invalid_observation_mode(pickle_hosts, mode):
    expected = outcome(
        None,
        lambda _: AsyncVectorEnv([CARTPOLE] * 2, shared_memory=False, observation_mode=mode),
    )[1]
    actual = outcome(
        None,
        lambda _: client.RemoteVectorEnv(
            [CARTPOLE] * 2, hosts=pickle_hosts[:2], allow_pickle=True, observation_mode=mode
        ),
    )[1]
    assert_same_error(expected, actual)


@pytest.mark.parametrize("mode", ["different", (BATCH, SINGLE)], ids=["different", "spaces"])
def test_observation_mode_different_and_space_pair(make_pair, mode):
    pair = make_pair(observation_mode=mode)
    assert_same(
        *both(
            pair,
            lambda e: (
                e.observation_space,
                e.single_observation_space,
                e.action_space,
                e.single_action_space,
                e.observation_mode,
            ),
        )
    )
    assert_same(*both(pair, lambda e: e.reset(seed=1)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker": lambda *a: None}, "no worker function to replace"),
        ({"max_concurrency": 1}, "no max_concurrency"),
        ({"context": object()}, "context must be a zmq.Context"),
    ],
    ids=["worker", "max_concurrency", "context-object"],
)
def test_kept_difference_async_only_arguments_that_change_behaviour_are_refused(kwargs, match):
    """Deliberate: hosts have no worker function and no concurrency semaphore to set."""
    with pytest.raises(TypeError, match=match):
        client.RemoteVectorEnv([CARTPOLE] * 2, **kwargs)
    with pytest.raises(TypeError, match="positional argument"):  # AsyncVectorEnv(fns, False)
        client.RemoteVectorEnv([CARTPOLE] * 2, False)


@pytest.mark.parametrize(
    ("kwargs", "warning"),
    [
        ({"shared_memory": True}, None),
        ({"shared_memory": False}, None),
        ({"context": "spawn"}, "ignores context='spawn'"),
        ({"daemon": False}, None),
        ({"daemon": True}, None),
    ],
    ids=["shared_memory", "no-shared_memory", "context-spawn", "daemon-False", "daemon-True"],
)
def test_async_only_arguments_without_effect_are_accepted(kwargs, warning):
    """A swapped ``AsyncVectorEnv(..., shared_memory=True, context="spawn")`` call still works.

    ``shared_memory`` has its own meaning here (local hosts' large observations) and no warning.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = client.RemoteVectorEnv([CARTPOLE] * 2, **kwargs)
    try:
        assert envs.reset(seed=0)[0].shape == (2, 4)
    finally:
        envs.close()
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    if warning is None:
        assert not messages
    else:
        assert any(warning in m for m in messages), messages


def test_env_fns_generator_is_read_once(pickle_hosts):
    """AsyncVectorEnv refuses a generator (TypeError: no len()); ours takes it (a superset)."""
    with pytest.raises(TypeError):
        AsyncVectorEnv((CARTPOLE for _ in range(2)), shared_memory=False)
    envs = client.RemoteVectorEnv(
        (CARTPOLE for _ in range(2)), hosts=pickle_hosts[:2], allow_pickle=True
    )
    try:
        assert envs.num_envs == 2 and len(envs.env_fns) == 2
    finally:
        envs.close()


def test_kept_difference_empty_env_fns_is_a_value_error():
    """AsyncVectorEnv fails with a bare IndexError (env_fns[0]); ours says what is wrong."""
    with pytest.raises(IndexError):
        AsyncVectorEnv([], shared_memory=False)
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        client.RemoteVectorEnv([])


def test_env_fns_by_keyword(pickle_hosts):
    envs = client.RemoteVectorEnv(env_fns=[CARTPOLE] * 2, hosts=pickle_hosts[:2])
    try:
        assert envs.num_envs == 2
    finally:
        envs.close()


# ---------------------------------------------------------------- reset


@pytest.mark.parametrize(
    "seed", [0, 7, [3, 5], (1, 2), True], ids=["zero", "int", "list", "tuple", "bool"]
)
def test_reset_seeds(make_pair, seed):
    pair = make_pair()
    assert_same(*both(pair, lambda e: e.reset(seed=seed)))
    assert_same(*both(pair, lambda e: e.step(ACTIONS)))


def test_reset_seed_list_with_none(make_pair):
    pair = make_pair()
    assert_same(*both(pair, lambda e: e.reset(seed=[1, None])[0][0]))  # env 1: unseeded


@pytest.mark.parametrize(
    ("seed", "message"),
    [([1, 2, 3], "exact"), ([1], "exact"), (1.5, None), (-1, "suffix")],
    ids=["too-many", "too-few", "float", "negative"],
)
def test_bad_reset_seeds(make_pair, seed, message):
    # float: TypeError on both ("object of type 'float' has no len()" vs "'float' object is
    # not iterable"); negative: the env's gymnasium.error.Error, prefixed with where.
    pair = make_pair()
    assert_same_error(*errors(pair, lambda e: e.reset(seed=seed)), message=message)
    pair[1].reset(seed=0)  # ours is still usable


@pytest.mark.parametrize("seed", [[1.5, 2.5], ["1", "2"]], ids=["floats", "strings"])
def test_non_integer_seeds_are_refused_as_gymnasium_does(make_pair, seed):
    # Gymnasium: gymnasium.error.Error "Seed must be a python integer, actual type: ..."
    # ours: 1.5 -> 1 silently, "1" -> 1 silently, "a" -> ValueError from int().
    assert_same_error(*errors(make_pair(), lambda e: e.reset(seed=seed)), message="suffix")


def test_kept_difference_numpy_integer_seeds_are_accepted(make_pair):
    """AsyncVectorEnv refuses np.int64 (TypeError: no len()) as an accident; ours takes it."""
    _, remote = make_pair()
    assert_same(remote.reset(seed=np.int64(4)), remote.reset(seed=4))
    assert_same(remote.reset(seed=np.array([4, 5])), remote.reset(seed=4))


@pytest.mark.parametrize(
    "mask",
    [
        [True, False],
        None,
        np.array([True, False, True]),
        np.array([[True, False]]),
        np.array([1, 0]),
        np.array([False, False]),
    ],
    ids=["list", "none", "wrong-shape", "2d", "int-dtype", "all-false"],
)
def test_bad_reset_mask(make_pair, mask):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    assert_same_error(*errors(pair, lambda e: e.reset(options={"reset_mask": mask})))
    assert_same(*both(pair, lambda e: e.reset(seed=0)))  # nothing left pending


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_reset_mask_in_each_autoreset_mode(make_pair, mode):
    pair = make_pair(FRAMES, autoreset_mode=mode)
    assert_same(*both(pair, lambda e: e.reset(seed=0)))
    assert_same(*both(pair, lambda e: e.step(ACTIONS)))
    mask = np.array([False, True])
    assert_same(
        *both(pair, lambda e: e.reset(seed=[5, 6], options={"reset_mask": mask, "offset": 1.0}))
    )
    # SAME_STEP infos: the key order is SyncVectorEnv's (final_obs first), see below
    assert_same(*both(pair, lambda e: ordered(e.step(ACTIONS))))


def test_kept_difference_reset_mask_is_not_popped_from_the_callers_options(make_pair):
    """AsyncVectorEnv pops ``reset_mask`` out of the caller's dict; ours leaves it there."""
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    options = {"reset_mask": np.array([True, False])}
    pair[0].reset(options=options)
    assert "reset_mask" not in options
    options = {"reset_mask": np.array([True, False])}
    pair[1].reset(options=options)
    assert "reset_mask" in options


def test_kept_difference_options_must_be_a_dict(make_pair):
    """Options travel as a map: AsyncVectorEnv hands a list to the env as is, ours refuses it."""
    reference, remote = make_pair()
    reference.reset(options=["x"])  # CartPole ignores it
    with pytest.raises((TypeError, ValueError), match="options"):
        remote.reset(options=["x"])


# ---------------------------------------------------------------- step


@pytest.mark.parametrize(
    ("actions", "message"),
    [(0, None), (np.array([0, 1, 1]), None), (np.array([0]), None)],
    ids=["scalar", "too-many", "too-few"],
)
def test_wrong_number_of_actions(make_pair, actions, message):
    # Types match (TypeError for a scalar, ValueError for a wrong count); ours names the
    # expected shape where AsyncVectorEnv says "Unable to iterate..." / "zip() argument 2...".
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    assert_same_error(*errors(pair, lambda e: e.step(actions)), message=message)
    assert_same(*both(pair, lambda e: e.step(ACTIONS)))  # nothing left pending


@pytest.mark.parametrize("actions", [[0, 1], (1, 0), np.array([1, 1], dtype=np.int32)])
def test_actions_as_list_tuple_or_array(make_pair, actions):
    pair = make_pair()
    assert_same(*both(pair, lambda e: e.reset(seed=2)))
    assert_same(*both(pair, lambda e: e.step(actions)))


@pytest.mark.parametrize(
    ("factory", "action", "setup"),
    [
        (CARTPOLE, ACTIONS, None),
        (CARTPOLE, np.array([5, 5]), "reset"),
        (CARTPOLE, np.array([1.0, 1.0]), "reset"),
        (functools.partial(gym.make, FAILING, step_error_at=1), ACTIONS, "reset"),
    ],
    ids=["step-before-reset", "out-of-range", "float-actions", "env-raises"],
)
def test_errors_raised_by_envs(make_pair, factory, action, setup):
    """Same type; ours prefixes the message with the host and env. Deliberate: ours stays usable."""
    pair = make_pair(factory)
    if setup:
        both(pair, lambda e: e.reset(seed=0))
    # (AsyncVectorEnv raises the last failing env's error, ours the first's: here all fail alike.)
    assert_same_error(*errors(pair, lambda e: e.step(action)), message="suffix")
    remote = pair[1]
    assert remote.reset(seed=0)[0].shape == (2, *remote.single_observation_space.shape)
    assert len(remote.get_attr("spec")) == 2
    assert outcome(pair[0], lambda e: e.reset(seed=0))[0] == "raised"  # its workers are gone


def test_kept_difference_exception_types_that_cannot_be_rebuilt(make_pair):
    """AsyncVectorEnv re-raises the env's own class; a non-builtin class reaches us wrapped."""
    factory = functools.partial(gym.make, FAILING, step_error_at=1, error="custom")
    pair = make_pair(factory)
    both(pair, lambda e: e.reset(seed=0))
    expected, actual = errors(pair, lambda e: e.step(ACTIONS))
    assert type(expected).__name__ == "SimulatorCrash"
    assert isinstance(actual, RemoteEnvError)
    assert actual.remote_type == "envserver.testing.envs.SimulatorCrash"
    assert str(expected) in str(actual)


def test_kept_difference_disabled_mode_refuses_to_step_a_finished_env(make_pair):
    """As SyncVectorEnv asserts; AsyncVectorEnv's check never fires and steps the env on."""
    pair = make_pair(functools.partial(gym.make, EPISODIC, max_steps=1), autoreset_mode="Disabled")
    both(pair, lambda e: e.reset(seed=0))
    assert_same(*both(pair, lambda e: e.step(ACTIONS)))
    assert outcome(pair[0], lambda e: e.step(ACTIONS))[0] == "ok"
    with pytest.raises(AssertionError, match="DISABLED"):
        pair[1].step(ACTIONS)


def test_same_step_autoreset_results(make_pair):
    """Same values; the info key order follows SyncVectorEnv (final_obs before final_info)."""
    pair = make_pair(FRAMES, autoreset_mode="SameStep")
    remote, reference = both(pair, rollout)
    assert_same(ordered(remote), ordered(reference))


def test_next_step_autoreset_results(make_pair):
    assert_same(*both(make_pair(FRAMES), rollout))


@pytest.mark.parametrize("copy", [True, False])
def test_copy(make_pair, copy):
    pair = make_pair(copy=copy)
    assert_same(
        *both(pair, lambda e: e.reset(seed=0)[0] is e.step(ACTIONS)[0]),
    )


# ---------------------------------------------------------------- the async state machine


WAITS = ["reset_wait", "step_wait", "call_wait"]


@pytest.mark.parametrize(
    ("wait", "pending"),
    [
        (wait, pending)
        for wait in WAITS
        for pending in (None, "reset", "step", "call")
        if pending is None or not wait.startswith(pending)  # not the right wait
    ],
)
def test_wait_without_its_async_call(make_pair, wait, pending):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    start = {
        None: lambda e: None,
        "reset": lambda e: e.reset_async(seed=0),
        "step": lambda e: e.step_async(ACTIONS),
        "call": lambda e: e.call_async("render_mode"),
    }[pending]
    both(pair, start)
    expected, actual = errors(pair, lambda e: getattr(e, wait)())
    assert isinstance(expected, NoAsyncCallError)
    assert_same_error(expected, actual)


MISUSES: dict[str, Callable[[Any], Any]] = {
    "reset_async": lambda e: e.reset_async(seed=0),
    "reset": lambda e: e.reset(),
    "reset_async-bad-seeds": lambda e: e.reset_async(seed=[1, 2, 3]),  # ValueError first
    "reset_async-mask-after-pending": lambda e: e.reset_async(options={"reset_mask": [1]}),
    "step_async": lambda e: e.step_async(ACTIONS),
    "step": lambda e: e.step(ACTIONS),
    "step_async-wrong-actions": lambda e: e.step_async(np.array([0, 1, 1])),
    "call_async": lambda e: e.call_async("render_mode"),
    "call": lambda e: e.call("render_mode"),
    "get_attr": lambda e: e.get_attr("spec"),
    "np_random_seed": lambda e: e.np_random_seed,
    "set_attr": lambda e: e.set_attr("foo", 1),
    "set_attr-bad-length": lambda e: e.set_attr("foo", [1, 2, 3]),  # ValueError first
}


@pytest.mark.parametrize("pending", ["reset", "step", "call"])
@pytest.mark.parametrize("misuse", list(MISUSES))
def test_calls_while_another_is_pending(make_pair, pending, misuse):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    start = {
        "reset": lambda e: e.reset_async(seed=1),
        "step": lambda e: e.step_async(ACTIONS),
        "call": lambda e: e.call_async("render_mode"),
    }[pending]
    both(pair, start)
    expected, actual = errors(pair, MISUSES[misuse])
    checked_first = misuse in ("reset_async-bad-seeds", "set_attr-bad-length")  # as Gymnasium
    assert isinstance(expected, ValueError if checked_first else AlreadyPendingCallError)
    assert_same_error(expected, actual)
    # the pending call was left alone and completes
    finish = {"reset": "reset_wait", "step": "step_wait", "call": "call_wait"}[pending]
    assert_same(*both(pair, lambda e: getattr(e, finish)()))


def test_render_while_a_call_is_pending(make_pair):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    both(pair, lambda e: e.step_async(ACTIONS))
    assert_same_error(*errors(pair, lambda e: e.render()))


# ---------------------------------------------------------------- after close


AFTER_CLOSE: dict[str, Callable[[Any], Any]] = {
    "reset": lambda e: e.reset(),
    "reset_async": lambda e: e.reset_async(),
    "reset_wait": lambda e: e.reset_wait(),
    "reset-bad-seeds": lambda e: e.reset(seed=[1, 2, 3]),
    "step": lambda e: e.step(ACTIONS),
    "step_async": lambda e: e.step_async(ACTIONS),
    "step_wait": lambda e: e.step_wait(),
    "step-scalar": lambda e: e.step(0),
    "call": lambda e: e.call("render_mode"),
    "call_async": lambda e: e.call_async("render_mode"),
    "call_wait": lambda e: e.call_wait(),
    "get_attr": lambda e: e.get_attr("spec"),
    "set_attr": lambda e: e.set_attr("foo", 1),
    "set_attr-bad-length": lambda e: e.set_attr("foo", [1, 2, 3]),
    "render": lambda e: e.render(),
    "np_random_seed": lambda e: e.np_random_seed,
    "np_random": lambda e: e.np_random,
}


def test_every_method_after_close(make_pair):
    pair = make_pair()
    both(pair, lambda e: e.close())
    for name, action in AFTER_CLOSE.items():
        expected, actual = errors(pair, action)
        assert isinstance(expected, ClosedEnvironmentError), name
        assert_same_error(expected, actual)


@pytest.mark.parametrize(
    "close",
    [
        lambda e: e.close(),
        lambda e: e.close(terminate=True),
        lambda e: e.close(timeout=1),
        lambda e: e.close(timeout=None, terminate=False),
    ],
    ids=["plain", "terminate", "timeout", "both-kwargs"],
)
def test_close_signatures_and_idempotence(make_pair, close):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    assert_same(*both(pair, lambda e: (e.closed, close(e), e.closed, close(e), e.close())))


def test_close_argument_errors(make_pair):
    pair = make_pair()
    assert_same_error(*errors(pair, lambda e: e.close(bogus=1)))  # close_extras' TypeError
    assert_same_error(*errors(pair, lambda e: e.close(1)))


@pytest.mark.parametrize("pending", ["reset", "step", "call"])
@pytest.mark.parametrize("kwargs", [{}, {"timeout": 1}], ids=["default", "timeout"])
def test_close_with_a_pending_call_warns(make_pair, pending, kwargs):
    pair = make_pair()
    start = {
        "reset": lambda e: e.reset_async(seed=1),
        "step": lambda e: e.step_async(ACTIONS),
        "call": lambda e: e.call_async("render_mode"),
    }[pending]
    messages = []
    for envs in pair:
        envs.reset(seed=0)
        start(envs)
        with pytest.warns(UserWarning) as record:
            envs.close(**kwargs)
        assert envs.closed
        messages.append([str(w.message) for w in record])
    assert messages[1] == messages[0]
    assert f"pending call to `{pending}`" in messages[0][0]


def test_close_terminate_with_a_pending_call_warns(make_pair):
    pair = make_pair()
    messages = []
    for envs in pair:
        envs.reset(seed=0)
        envs.step_async(ACTIONS)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            envs.close(terminate=True)
        messages.append([str(w.message) for w in record])
    assert messages[1] == messages[0]


def test_close_timeout_bounds_close_with_a_pending_step(make_pair):
    """AsyncVectorEnv gives the pending call ``timeout`` seconds, then terminates its workers;
    ours then still sends CLOSE and waits (up to 5 s) for the hosts to finish the step."""
    pair = make_pair(functools.partial(gym.make, EPISODIC, step_delay_s=2.0))
    took = []
    for envs in pair:
        envs.reset(seed=0)
        envs.step_async(ACTIONS)
        start = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            envs.close(timeout=0.1)
        took.append(time.monotonic() - start)
    assert took[0] < 1.0
    assert took[1] < 1.0, f"close(timeout=0.1) took {took[1]:.1f} s"


def test_del_without_close_stops_local_hosts():
    envs = client.RemoteVectorEnv([CARTPOLE] * 2)
    processes = list(envs._hosts.local.processes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning and no exception either
        del envs
        gc.collect()
    deadline = time.monotonic() + 10
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p.poll() is not None for p in processes)


# ---------------------------------------------------------------- timeouts


@pytest.mark.parametrize(
    ("start", "wait"),
    [
        (lambda e: e.step_async(ACTIONS), lambda e: e.step_wait(timeout=0.05)),
        (lambda e: e.call_async("nap"), lambda e: e.call_wait(timeout=0.05)),
    ],
    ids=["step_wait", "call_wait"],
)
def test_wait_timeout(make_pair, start, wait):
    """multiprocessing.TimeoutError with Gymnasium's message; ours is also a TimeoutError."""
    pair = make_pair(SLOW)
    both(pair, lambda e: e.reset(seed=0))
    both(pair, lambda e: e.set_attr("nap", functools.partial(time.sleep, 1.0)))
    both(pair, start)
    expected, actual = errors(pair, wait)
    assert type(expected) is multiprocessing.TimeoutError
    assert_same_error(expected, actual)
    assert isinstance(actual, TimeoutError)
    assert_same(*both(pair, lambda e: e._state.value))  # back to idle, as Gymnasium does


@pytest.mark.parametrize("timeout", [0, 0.05])
def test_reset_wait_timeout(make_pair, timeout):
    pair = make_pair(SLOW_RESET)
    both(pair, lambda e: e.reset_async(seed=0))
    expected, actual = errors(pair, lambda e: e.reset_wait(timeout=timeout))
    assert_same_error(expected, actual)


# ---------------------------------------------------------------- call, get_attr, set_attr


@pytest.mark.parametrize(
    "action",
    [
        lambda e: e.call("render_mode"),  # an attribute
        lambda e: e.call("render_mode", 1, x=2),  # an attribute: args ignored
        lambda e: e.call("get_wrapper_attr", "spec"),  # a method with args
        lambda e: e.call(name="render_mode"),
        lambda e: e.call("render"),
        lambda e: e.call("np_random_seed"),
        lambda e: (e.call_async("metadata"), e.call_wait(timeout=5)),
        lambda e: type(e.call("unwrapped")[0]).__name__,
        lambda e: e.get_attr("render"),  # a method: called
        lambda e: e.get_attr("metadata"),
        lambda e: e.get_attr("max_steps"),
    ],
    ids=[
        "attribute",
        "attribute-with-args",
        "method-with-args",
        "name-keyword",
        "render",
        "np_random_seed",
        "call_async-wait",
        "unwrapped",
        "get_attr-method",
        "get_attr-metadata",
        "get_attr-wrapper",
    ],
)
def test_call_and_get_attr(make_pair, action):
    pair = make_pair(FRAMES)
    both(pair, lambda e: e.reset(seed=0))
    assert_same(*both(pair, action))


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda e: e.call("nonexistent"), "suffix"),
        (lambda e: e.get_attr("nonexistent"), "suffix"),
        (lambda e: e.call("reset"), "suffix"),
        (lambda e: e.call("step", 0), "suffix"),
        (lambda e: e.call("close"), "suffix"),
        (lambda e: e.call("get_wrapper_attr", "spec", name="spec"), "exact"),
    ],
    ids=["missing", "get_attr-missing", "reset", "step", "close", "name-twice"],
)
def test_call_errors(make_pair, action, message):
    pair = make_pair()
    assert_same_error(*errors(pair, action), message=message)


def test_call_async_passes_a_name_keyword_to_the_method(make_pair):
    pair = make_pair()
    assert_same(
        *both(pair, lambda e: (e.call_async("get_wrapper_attr", name="render_mode"), e.call_wait()))
    )


def test_kept_difference_async_worker_commands_are_not_reserved(make_pair):
    """AsyncVectorEnv refuses its worker's commands ``_setattr``/``_check_spaces`` by name with
    a ValueError; ours has no such commands, so they are ordinary (missing) attributes."""
    pair = make_pair()
    expected, actual = errors(pair, lambda e: e.call("_check_spaces"))
    assert isinstance(expected, ValueError)
    assert isinstance(actual, AttributeError)


@pytest.mark.parametrize(
    "values",
    [3, [3, 4], (3, 4), np.array([3, 4]), {"a": 1}, None],
    ids=["scalar", "list", "tuple", "array-broadcast", "dict-broadcast", "none"],
)
def test_set_attr(make_pair, values):
    pair = make_pair()
    assert_same(*both(pair, lambda e: (e.set_attr("foo", values), e.get_attr("foo"))))
    assert_same(
        *both(
            pair,
            lambda e: (
                e.set_attr(name="_max_episode_steps", values=5),
                e.get_attr("_max_episode_steps"),
            ),
        )
    )


@pytest.mark.parametrize("values", [[1], (1, 2, 3), []], ids=["short", "long-tuple", "empty"])
def test_set_attr_wrong_number_of_values(make_pair, values):
    assert_same_error(*errors(make_pair(), lambda e: e.set_attr("foo", values)))


def test_set_attr_of_a_read_only_property(make_pair):
    assert_same_error(
        *errors(make_pair(), lambda e: e.set_attr("render_mode", "x")), message="suffix"
    )


# ---------------------------------------------------------------- attributes


def test_attributes(make_pair):
    pair = make_pair(FRAMES)
    assert_same(
        *both(
            pair,
            lambda e: (
                e.metadata,
                e.render_mode,
                e.spec,
                e.unwrapped is e,
                e.num_envs,
                e.closed,
                e.copy,
                e.autoreset_mode,
                e.observation_mode,
                e.single_observation_space,
                e.single_action_space,
                e.observation_space,
                e.action_space,
                isinstance(e, gym.vector.VectorEnv),
            ),
        )
    )


def test_metadata_of_an_env_without_render_modes(make_pair):
    assert_same(*both(make_pair(), lambda e: (e.metadata, e.render_mode)))


def test_np_random_after_reset(make_pair):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=11))
    assert_same(*both(pair, lambda e: e.np_random_seed))
    assert_same(
        *both(pair, lambda e: [g.bit_generator.state for g in e.np_random]),
    )
    assert_same_error(*errors(pair, lambda e: setattr(e, "np_random", None)), message=None)


def test_np_random_seed_before_any_seeded_reset(make_pair):
    pair = make_pair()
    seeds = both(pair, lambda e: e.np_random_seed)
    assert [type(s) for s in seeds[0]] == [type(s) for s in seeds[1]] == [int, int]


def test_env_fns_and_observations_attributes(make_pair):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    assert_same(*both(pair, lambda e: (len(e.env_fns), e.observations)))


def test_async_state_is_gymnasiums():
    from gymnasium.vector.async_vector_env import AsyncState

    assert client.AsyncState is AsyncState


def test_kept_difference_repr_names_the_hosts(make_pair):
    """Ours adds the host count; the class name differs anyway."""
    reference, remote = make_pair()
    assert repr(remote) == ours(repr(reference))[:-1] + ", hosts=2)"
    assert str(remote) == repr(remote)
    reference.spec = remote.spec = gym.spec("CartPole-v1")
    assert repr(remote) == "RemoteVectorEnv(CartPole-v1, num_envs=2, hosts=2)"
    assert repr(reference) == "AsyncVectorEnv(CartPole-v1, num_envs=2)"


def test_render_returns_a_tuple_of_frames(make_pair):
    pair = make_pair(FRAMES)
    both(pair, lambda e: e.reset(seed=0))
    both(pair, lambda e: e.step(ACTIONS))
    remote, reference = both(pair, lambda e: e.render())
    assert type(reference) is tuple
    assert_same(remote, reference)
    assert_same(*both(pair, lambda e: e.call("render")))


def test_render_without_render_mode(make_pair):
    pair = make_pair()
    both(pair, lambda e: e.reset(seed=0))
    assert_same(*both(pair, lambda e: e.render()))


# ---------------------------------------------------------------- under vector wrappers


def _drop_episode_time(results: list[Any]) -> list[Any]:
    for result in results:
        infos = result[-1] if isinstance(result[-1], list) else [result[-1]]
        for info in infos:
            info.get("episode", {}).pop("t", None)  # wall time
    return results


@pytest.mark.parametrize(
    "wrap",
    [
        lambda e: vector_wrappers.RecordEpisodeStatistics(e),
        lambda e: vector_wrappers.NormalizeObservation(e),
        lambda e: vector_wrappers.NormalizeReward(e),
        lambda e: vector_wrappers.TransformObservation(e, lambda o: o * 2),
        lambda e: vector_wrappers.ClipReward(e, 0.0, 0.5),
        lambda e: vector_wrappers.DictInfoToList(e),
        lambda e: vector_wrappers.RecordEpisodeStatistics(vector_wrappers.NormalizeObservation(e)),
    ],
    ids=[
        "RecordEpisodeStatistics",
        "NormalizeObservation",
        "NormalizeReward",
        "TransformObservation",
        "ClipReward",
        "DictInfoToList",
        "stacked",
    ],
)
def test_under_vector_wrappers(make_pair, wrap):
    pair = tuple(wrap(envs) for envs in make_pair(FRAMES))
    remote, reference = both(pair, lambda e: _drop_episode_time(rollout(e)))
    assert_same(remote, reference)
    assert_same(
        *both(
            pair,
            lambda e: (
                e.metadata,
                e.render_mode,
                e.spec,
                e.num_envs,
                e.observation_space,
                e.single_action_space,
                type(e.unwrapped).__name__.replace("Async", "Remote"),
                ours(repr(e)).replace("hosts=2", "").replace(", )", ")"),
            ),
        )
    )
    both(pair, lambda e: e.close())
    assert all(e.unwrapped.closed for e in pair)


def test_sync_vector_env_is_the_results_oracle(make_pair):
    """Ours and AsyncVectorEnv agree with SyncVectorEnv on NEXT_STEP rollouts."""
    pair = make_pair(FRAMES)
    sync = SyncVectorEnv([FRAMES] * 2)
    try:
        remote, reference = both(pair, rollout)
        assert_same(remote, reference)
        assert_same(remote, rollout(sync))
    finally:
        sync.close()
