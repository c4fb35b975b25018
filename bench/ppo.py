"""A PPO-shaped training loop over any vector env: what ``python -m bench train`` times.

Every step the policy (a small torch MLP) runs a forward pass on the batch of
observations and samples the actions; every ``rollout_steps`` steps the loop
runs a PPO update on the collected rollout (GAE, a few epochs of minibatches of
the clipped loss, backward, Adam).  It is the shape of CleanRL's ``ppo.py``,
stripped of logging: it trains, but is here to load the cores the way a
trainer does while the envs step.

The loop talks to envs through ``bench.subjects.Vec``'s trainer face: ``reset()`` gives the first
observations of ``batch`` envs, ``step(actions)`` the next ``(obs, rewards, dones)``.  An async system
(``batch < num_envs``) returns whichever envs finished first, so its rollout rows hold different envs
from row to row (the update's cost is the same; its advantages mix envs, which does not matter for timing).
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from ._timing import DeviceShape

if TYPE_CHECKING:
    from .subjects import Vec


GPU_SHAPED = "gpu-shaped"   # Trainer's device where a GPU is wanted and torch sees none


@dataclass(frozen=True)
class PPOConfig:
    """CleanRL's PPO defaults, but ``rollout_steps`` counts loop steps (one batch each)."""

    rollout_steps: int = 128
    epochs: int = 4
    minibatches: int = 4
    hidden: int = 64
    lr: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5


def default_rollout_steps(batch: int) -> int:
    """Loop steps per update: about 1,024 transitions per update (CleanRL's CartPole: 4 envs × 128 ... here
    8 × 128), at least 8 steps.  The update's cost per transition does not depend on it."""
    return max(8, 1024 // batch)


class Agent(nn.Module):
    """Actor and critic, two tanh layers of ``hidden`` units each (CleanRL's MLP agent).

    Images (``(C, H, W)`` uint8) are scaled to [0, 1] and average-pooled 4×4 before the
    MLP: a cheap stand-in for a conv encoder that keeps the policy small.  Discrete
    actions: a categorical head; Box actions: a Gaussian with a learnt log-std."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden: int) -> None:
        super().__init__()
        shape = obs_space.shape
        self.image = len(shape) == 3
        if self.image:
            self.encode: nn.Module = nn.Sequential(nn.AvgPool2d(4), nn.Flatten())
            features = shape[0] * (shape[1] // 4) * (shape[2] // 4)
        else:
            self.encode = nn.Flatten()
            features = int(np.prod(shape))
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        out = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))

        def mlp(last: int, std: float) -> nn.Sequential:
            return nn.Sequential(_layer(features, hidden), nn.Tanh(), _layer(hidden, hidden), nn.Tanh(),
                                 _layer(hidden, last, std))

        self.critic = mlp(1, 1.0)
        self.actor = mlp(out, 0.01)
        self.log_std = None if self.discrete else nn.Parameter(torch.zeros(out))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.image:
            x = x / 255.0
        return self.encode(x)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def dist(self, x: torch.Tensor) -> Categorical | Normal:
        out = self.actor(x)
        if self.discrete:
            return Categorical(logits=out)
        return Normal(out, self.log_std.exp().expand_as(out))

    def act(self, obs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Actions sampled with ``gen``, their log-probabilities and the values of ``obs``."""
        x = self.features(obs)
        d = self.dist(x)
        if self.discrete:
            action = torch.multinomial(d.probs, 1, generator=gen).squeeze(-1)
        else:
            action = d.mean + d.stddev * torch.randn(d.mean.shape, generator=gen, device=gen.device)
        return action, self.log_prob(d, action), self.critic(x).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``action``, entropies and values under the current parameters."""
        x = self.features(obs)
        d = self.dist(x)
        entropy = d.entropy() if self.discrete else d.entropy().sum(-1)
        return self.log_prob(d, action), entropy, self.critic(x).squeeze(-1)

    def log_prob(self, d: Categorical | Normal, action: torch.Tensor) -> torch.Tensor:
        return d.log_prob(action) if self.discrete else d.log_prob(action).sum(-1)


def _layer(n_in: int, n_out: int, std: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class Trainer:
    """The loop over one :class:`Vec`: ``run(seconds)`` trains and counts env steps.

    Everything random is seeded from ``seed``: the parameters, the sampled actions
    (a torch generator of its own) and the minibatch order, so two envs that
    return the same observations train to the same parameters.  ``device``: where the policy,
    rollout and update live (``"cuda"``: observations go there and actions come back every step,
    as in CleanRL's scripts).  ``GPU_SHAPED``: a GPU seen from the host, without one: each forward
    pass and minibatch step is a :class:`~bench._timing.DeviceShape` call and the actions are
    random (seeded), so the envs step beside a trainer process that is mostly asleep."""

    def __init__(self, env: Vec, config: PPOConfig, seed: int = 0, device: str = "cpu") -> None:
        self.shape = DeviceShape() if device == GPU_SHAPED else None
        self.env, self.config, self.device = env, config, torch.device("cpu" if self.shape else device)
        torch.manual_seed(seed)
        self.agent = Agent(env.observation_space, env.action_space, config.hidden).to(self.device)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=config.lr, eps=1e-5)
        self.gen = torch.Generator(self.device).manual_seed(seed)
        self._low_high = None
        space = env.action_space
        if isinstance(space, gym.spaces.Box):
            self._low_high = (space.low, space.high)
        self._action_dtype = space.dtype
        self.random_actions = gym.vector.utils.batch_space(space, env.batch)
        self.random_actions.seed(seed)
        t, b = config.rollout_steps, env.batch
        obs_dtype = torch.uint8 if self.agent.image else torch.float32
        zeros = functools.partial(torch.zeros, device=self.device)
        self.obs = zeros((t, b, *env.observation_space.shape), dtype=obs_dtype)
        act_shape = () if self.agent.discrete else space.shape
        self.actions = zeros((t, b, *act_shape), dtype=torch.int64 if self.agent.discrete else torch.float32)
        self.logprobs, self.values, self.rewards, self.dones = (zeros((t, b)) for _ in range(4))
        self.next_obs = self._tensor(env.reset())
        self.next_done = zeros(b)
        self.steps = 0     # env steps so far
        self.env_seconds = 0.0   # wall time inside env.step so far: the env's share of the loop

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=None if self.agent.image else torch.float32, device=self.device)

    def _to_env(self, action: torch.Tensor) -> np.ndarray:
        a = action.cpu().numpy()
        if self._low_high is not None:
            a = np.clip(a, *self._low_high)
        return a.astype(self._action_dtype, copy=False)

    def collect(self) -> None:
        """One rollout: ``rollout_steps`` loop steps, a policy forward pass on each."""
        env, agent = self.env, self.agent
        for t in range(self.config.rollout_steps):
            self.obs[t] = self.next_obs
            self.dones[t] = self.next_done
            if self.shape:
                self.shape.call()
                actions = self.random_actions.sample()
            else:
                with torch.no_grad():
                    action, self.logprobs[t], self.values[t] = agent.act(self.next_obs, self.gen)
                self.actions[t] = action
                actions = self._to_env(action)
            started = time.perf_counter()
            obs, reward, done = env.step(actions)
            self.env_seconds += time.perf_counter() - started
            self.rewards[t] = torch.as_tensor(reward, dtype=torch.float32, device=self.device)
            self.next_obs = self._tensor(obs)
            self.next_done = torch.as_tensor(done, dtype=torch.float32, device=self.device)
        self.steps += self.config.rollout_steps * env.batch

    def update(self) -> None:
        """GAE over the rollout, then ``epochs`` × ``minibatches`` clipped-PPO steps."""
        c = self.config
        if self.shape:
            for _ in range(c.epochs * c.minibatches):
                self.shape.call()
            return
        with torch.no_grad():
            next_value = self.agent.value(self.next_obs)
            advantages = torch.zeros_like(self.rewards)
            last = torch.zeros_like(next_value)
            for t in reversed(range(c.rollout_steps)):
                if t == c.rollout_steps - 1:
                    nonterminal, nv = 1.0 - self.next_done, next_value
                else:
                    nonterminal, nv = 1.0 - self.dones[t + 1], self.values[t + 1]
                delta = self.rewards[t] + c.gamma * nv * nonterminal - self.values[t]
                last = delta + c.gamma * c.gae_lambda * nonterminal * last
                advantages[t] = last
            returns = advantages + self.values
        n = c.rollout_steps * self.env.batch
        obs = self.obs.reshape(n, *self.obs.shape[2:])
        actions = self.actions.reshape(n, *self.actions.shape[2:])
        logprobs, adv, ret = self.logprobs.reshape(n), advantages.reshape(n), returns.reshape(n)
        size = max(1, n // c.minibatches)
        for _ in range(c.epochs):
            order = torch.randperm(n, generator=self.gen, device=self.device)
            for start in range(0, n, size):
                mb = order[start:start + size]
                new_logprob, entropy, value = self.agent.evaluate(obs[mb], actions[mb])
                ratio = (new_logprob - logprobs[mb]).exp()
                a = adv[mb]
                a = (a - a.mean()) / (a.std() + 1e-8)
                pg_loss = torch.max(-a * ratio, -a * ratio.clamp(1 - c.clip, 1 + c.clip)).mean()
                v_loss = 0.5 * ((value - ret[mb]) ** 2).mean()
                loss = pg_loss + c.vf_coef * v_loss - c.ent_coef * entropy.mean()
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.agent.parameters(), c.max_grad_norm)
                self.optimizer.step()

    def run(self, seconds: float) -> tuple[int, float]:
        """Whole iterations until ``seconds`` have passed (at least one); returns (env steps, elapsed s)."""
        start, steps = time.perf_counter(), self.steps
        while True:
            self.collect()
            self.update()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return self.steps - steps, elapsed

    def state(self) -> dict[str, Any]:
        """Every parameter and optimizer tensor, for comparing two runs."""
        return {"agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict()}

