# cython: language_level=3, boundscheck=False, wraparound=False
"""One env's step result written into its shared rows, in C.

A shard pays this for every env on every step.  In Python the status writes and the
observation row were ~1 µs an env (three numpy scalar stores, a dtype comparison, a
row setitem): beside a cheap env stepped in the trainer's own process (CartPole, 32
envs) that was the pool's whole margin over ``SyncVectorEnv``.  Only the common case is
here; whatever it does not take (another dtype, shape or memory order, a reward that
is not a real number) goes back to the Python writers, which define the behaviour.
"""
import numpy as np

cimport numpy as cnp
from libc.math cimport isfinite
from libc.string cimport memmove

cnp.import_array()


cdef object NP_TRUE = np.True_, NP_FALSE = np.False_


cdef inline int _plain_flag(object value):
    """1 or 0 for a bool (python's or numpy's), -1 for anything else: numpy converts that itself."""
    if value is True or value is NP_TRUE:
        return 1
    if value is False or value is NP_FALSE:
        return 0
    return -1


cdef bint _plain_dtype(int typenum):
    return typenum == cnp.NPY_BOOL or cnp.PyTypeNum_ISINTEGER(typenum) or cnp.PyTypeNum_ISFLOAT(typenum) \
        or cnp.PyTypeNum_ISCOMPLEX(typenum)


cdef class ResultRows:
    """The status columns of a region (``reward`` float64, ``terminated``/``truncated`` bool,
    all ``(num_envs,)``) and, when the observation is one leaf, its rows ``(num_envs, *shape)``.

    ``put_status(i, reward, terminated, truncated)`` stores env ``i``'s result and returns
    False without storing anything when ``strict`` and the reward is not finite.
    ``put_obs(i, obs)`` copies ``obs`` into row ``i`` and returns True when it is an ndarray of
    exactly the row's dtype and shape; otherwise it copies nothing and returns False."""
    cdef cnp.ndarray reward_col, terminated_col, truncated_col
    cdef cnp.ndarray obs_rows   # None: no row takes the C copy
    cdef double* reward
    cdef cnp.npy_bool* terminated
    cdef cnp.npy_bool* truncated
    cdef Py_ssize_t num_envs
    cdef bint strict
    cdef char* obs
    cdef Py_ssize_t row_bytes
    cdef int obs_type
    cdef int obs_ndim
    cdef cnp.npy_intp obs_dims[64]   # NPY_MAXDIMS is 64 since numpy 2

    def __init__(self, cnp.ndarray reward, cnp.ndarray terminated, cnp.ndarray truncated, obs_rows, bint strict):
        n = reward.shape[0] if reward.ndim == 1 else -1   # shape[0] of a 0-d array would read past its shape
        for name, col, typenum in (("reward", reward, cnp.NPY_FLOAT64), ("terminated", terminated, cnp.NPY_BOOL),
                                   ("truncated", truncated, cnp.NPY_BOOL)):
            if (cnp.PyArray_TYPE(col) != typenum or cnp.PyArray_NDIM(col) != 1 or col.shape[0] != n
                    or not cnp.PyArray_IS_C_CONTIGUOUS(col) or not cnp.PyArray_ISWRITEABLE(col)):
                raise ValueError(f"{name}: a writeable contiguous column of {n} values of the region's dtype")
        self.reward_col, self.terminated_col, self.truncated_col = reward, terminated, truncated
        self.reward = <double*>cnp.PyArray_DATA(reward)
        self.terminated = <cnp.npy_bool*>cnp.PyArray_DATA(terminated)
        self.truncated = <cnp.npy_bool*>cnp.PyArray_DATA(truncated)
        self.num_envs = n
        self.strict = strict
        if obs_rows is not None:
            rows = <cnp.ndarray?>obs_rows
            if (1 <= rows.ndim <= 65 and rows.shape[0] == n and cnp.PyArray_IS_C_CONTIGUOUS(rows)
                    and cnp.PyArray_ISWRITEABLE(rows) and cnp.PyArray_ISNOTSWAPPED(rows)
                    and _plain_dtype(cnp.PyArray_TYPE(rows))):
                self.obs_rows = rows
                self.obs = <char*>cnp.PyArray_DATA(rows)
                self.row_bytes = rows.itemsize * (rows.size // n if n else 0)
                self.obs_type = cnp.PyArray_TYPE(rows)
                self.obs_ndim = rows.ndim - 1
                for k in range(self.obs_ndim):
                    self.obs_dims[k] = rows.shape[k + 1]

    cdef inline Py_ssize_t _env(self, Py_ssize_t i) except -1:
        if i < 0 or i >= self.num_envs:
            raise IndexError(f"env {i} is not in this region of {self.num_envs} envs")
        return i

    def put_status(self, Py_ssize_t i, reward, terminated, truncated) -> bool:
        cdef double r
        cdef int flag
        self._env(i)
        try:
            r = reward
        except TypeError:
            if self.strict:
                raise   # as math.isfinite raises it: the reward is not a real number
            self.reward_col[i] = reward   # numpy's own conversion, as before (a numeric string...)
            r = self.reward[i]
        if self.strict and not isfinite(r):
            return False
        self.reward[i] = r
        flag = _plain_flag(terminated)
        if flag < 0:
            self.terminated_col[i] = terminated   # numpy's conversion, as before (a 1-element array...)
        else:
            self.terminated[i] = flag
        flag = _plain_flag(truncated)
        if flag < 0:
            self.truncated_col[i] = truncated
        else:
            self.truncated[i] = flag
        return True

    def put_obs(self, Py_ssize_t i, obs) -> bool:
        cdef cnp.ndarray a
        cdef int k
        if self.obs_rows is None or type(obs) is not np.ndarray:
            return False
        a = <cnp.ndarray>obs
        if (cnp.PyArray_TYPE(a) != self.obs_type or cnp.PyArray_NDIM(a) != self.obs_ndim
                or not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISNOTSWAPPED(a)):
            return False
        for k in range(self.obs_ndim):
            if cnp.PyArray_DIM(a, k) != self.obs_dims[k]:
                return False
        self._env(i)
        memmove(self.obs + i * self.row_bytes, cnp.PyArray_DATA(a), self.row_bytes)   # it may be a view of its own row
        return True
