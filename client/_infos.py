"""The infos of a batch, in Gymnasium's vector layout or as one dict per env.

Gymnasium's vector envs (``SyncVectorEnv``, ``AsyncVectorEnv``) return one dict for the whole
batch. Each key that any env's info holds maps to a column with one entry per env, beside a
boolean mask under ``"_" + key`` that says which envs set it:

- a Python ``int``, ``float`` or ``bool``, or a numpy number, makes a column of that type;
- a numpy array makes a column of arrays of its shape and dtype (one more axis, envs first);
- a dict makes a dict of columns, built the same way, one level down;
- anything else (a string, a list, ``None``, a numpy bool), and always ``"final_obs"``, makes an
  object column with ``None`` where an env set nothing.

A column takes its type from the first env that sets the key; envs that do not set it keep the
column's zero (or ``None``). Keys keep the order in which they first appear, each followed by its
mask (an env's own key ``"_x"`` shares its place with the mask of ``"x"``, as in Gymnasium). The
parity and differential tests hold this against ``SyncVectorEnv`` in every autoreset mode, and
``tests/client/test_infos.py`` against it for generated infos.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["InfoBatch", "add_env_info", "check_info_format"]

_SCALARS = (int, float, bool)


def check_info_format(info_format: str) -> str:
    """Returns ``info_format`` if it is ``"dict"`` or ``"list"``.

    Raises:
        ValueError: Otherwise.
    """
    if info_format not in ("dict", "list"):
        raise ValueError(f"info_format must be 'dict' or 'list', got {info_format!r}")
    return info_format


def _objects(num_envs: int) -> np.ndarray:
    """An object column of ``None``."""
    return np.full(num_envs, None, dtype=object)


def _column_for(value: Any, num_envs: int) -> np.ndarray:
    """An empty column for a key whose first value is ``value``."""
    if type(value) in _SCALARS or issubclass(type(value), np.number):
        return np.zeros(num_envs, dtype=type(value))
    if isinstance(value, np.ndarray):
        return np.zeros((num_envs, *value.shape), dtype=value.dtype)
    return _objects(num_envs)


def add_env_info(
    infos: dict[str, Any], info: dict[str, Any], position: int, num_envs: int
) -> dict[str, Any]:
    """Adds one env's info at ``position`` to the infos of a batch of ``num_envs`` envs.

    Args:
        infos: The batch's infos so far (changed in place).
        info: The env's own info dict.
        position: The env's position in the batch.
        num_envs: The batch size.

    Returns:
        The infos.
    """
    for key, value in info.items():
        if isinstance(value, dict) and key != "final_obs":
            column = add_env_info(infos.get(key, {}), value, position, num_envs)
        else:
            column = infos.get(key)
            if column is None:
                column = _objects(num_envs) if key == "final_obs" else _column_for(value, num_envs)
            column[position] = value
        mask_key = f"_{key}"
        mask = infos.get(mask_key)
        if mask is None:
            mask = np.zeros(num_envs, dtype=np.bool_)
        mask[position] = True
        infos[key] = column
        infos[mask_key] = mask
    return infos


class InfoBatch:
    """Builds the infos of a batch of ``num_envs`` envs from the envs' own info dicts.

    As Gymnasium does (``"dict"``: the layout above, a dict of columns with ``_key`` masks), or
    one dict per env (``"list"``: the env's infos of that step merged in order, as SB3 and other
    per-env APIs want them).
    """

    def __init__(self, num_envs: int, info_format: str = "dict") -> None:
        self.num_envs = num_envs
        self.per_env = check_info_format(info_format) == "list"

    def start(self) -> dict[str, Any] | list[dict[str, Any]]:
        """Empty infos for the batch."""
        return [{} for _ in range(self.num_envs)] if self.per_env else {}

    def add(self, infos: Any, info: dict[str, Any], position: int) -> Any:
        """Adds one env's info at ``position`` in the batch; returns the infos."""
        if self.per_env:
            infos[position].update(info)
            return infos
        return add_env_info(infos, info, position, self.num_envs)

    def label(self, infos: Any, env_ids: np.ndarray) -> Any:
        """Adds the ``env_id`` of each env of a first-ready batch."""
        if self.per_env:
            for info, env_id in zip(infos, env_ids.tolist()):
                info["env_id"] = env_id
        else:
            infos["env_id"] = env_ids
        return infos
