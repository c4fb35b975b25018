"""The shape of CleanRL's ``ppo_atari_envpool.py`` with the edits docs/porting/cleanrl.md lists.

The script builds its envs with ``envpool.make(..., env_type="gym")``, sets ``num_envs`` and the
single-env spaces on them, wraps them in an episode-statistics ``gym.Wrapper`` of its own (old gym
4-tuple, EnvPool's ``info["reward"]``/``info["terminated"]``/``info["lives"]``), builds its Agent from
``envs.single_action_space``/``envs.single_observation_space`` *through the wrapper*, collects a
rollout with ``torch.Tensor(envs.reset())`` and ``envs.step(action.cpu().numpy())``, and updates.
These tests do the same with ``import shmpool.vector as envpool`` and ``import gymnasium as gym``:
the wrapper, an Agent, a short rollout and one PPO update.  (Our code, not CleanRL's.)"""
from __future__ import annotations

import importlib.util

import gymnasium as gym
import heavy_imports
import numpy as np
import pytest
from cleanrl_shapes import EnvPoolEpisodeStats as EpisodeStats

import shmpool.vector as envpool

heavy_imports.require("torch")
torch = heavy_imports.module("torch")

pytestmark = [pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("ale_py", "cv2")),
                                 reason="needs ale-py, cv2 (extra [atari])"),
              pytest.mark.slow,             # a ported CleanRL agent (torch) rolls out on Atari and updates once
              pytest.mark.heavy_imports]    # torch in the test process

NUM_ENVS, NUM_STEPS = 4, 8


def new_agent(envs):
    """A small actor-critic sized from the spaces the script reads off the wrapped envs (its class is
    made here, not at import: torch stays out of the suite's collection)."""
    nn = torch.nn

    class Agent(nn.Module):
        def __init__(self, envs) -> None:
            super().__init__()
            channels, height, width = envs.single_observation_space.shape
            self.body = nn.Sequential(nn.Conv2d(channels, 8, 8, stride=4), nn.ReLU(), nn.Flatten())
            hidden = 8 * ((height - 8) // 4 + 1) * ((width - 8) // 4 + 1)
            self.actor = nn.Linear(hidden, envs.single_action_space.n)
            self.critic = nn.Linear(hidden, 1)

        def act(self, x, action=None):
            h = self.body(x / 255.0)
            dist = torch.distributions.Categorical(logits=self.actor(h))
            if action is None:
                action = dist.sample()
            return action, dist.log_prob(action), dist.entropy(), self.critic(h).squeeze(-1)

    return Agent(envs)


def make_envs():
    envs = envpool.make("Pong-v5", env_type="gym", num_envs=NUM_ENVS, episodic_life=True, reward_clip=True,
                        seed=1)
    # The script's own lines after make (kept by the port).
    envs.num_envs = NUM_ENVS
    envs.single_action_space = envs.action_space
    envs.single_observation_space = envs.observation_space
    return envs


def test_without_the_forwarding_edit_the_agent_cannot_read_the_spaces(no_leaks):
    envs = EpisodeStats(make_envs(), forward_spaces=False)
    try:
        with pytest.raises(AttributeError, match="has no attribute .single_(observation|action)_space"):
            new_agent(envs)
    finally:
        envs.close()


def test_wrapper_agent_rollout_and_one_update(no_leaks):
    torch.manual_seed(0)
    envs = EpisodeStats(make_envs())
    try:
        assert isinstance(envs.action_space, gym.spaces.Discrete)   # the script's assert, gymnasium's class
        agent = new_agent(envs)
        optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
        shape = envs.single_observation_space.shape
        obs = torch.zeros((NUM_STEPS, NUM_ENVS, *shape))
        actions = torch.zeros((NUM_STEPS, NUM_ENVS), dtype=torch.long)
        logprobs, rewards, dones, values = (torch.zeros((NUM_STEPS, NUM_ENVS)) for _ in range(4))

        next_obs = torch.Tensor(envs.reset())
        next_done = torch.zeros(NUM_ENVS)
        assert next_obs.shape == (NUM_ENVS, 4, 84, 84)
        for step in range(NUM_STEPS):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.act(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value
            raw_obs, reward, done, info = envs.step(action.cpu().numpy())
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(raw_obs), torch.Tensor(done)
            assert {"lives", "reward", "terminated", "r", "l"} <= set(info)
            assert info["lives"].dtype == np.int32 and info["r"].dtype == np.float32
        assert info["l"].tolist() == [NUM_STEPS] * NUM_ENVS          # no Pong game ends in 8 steps

        with torch.no_grad():   # GAE, then one clipped-PPO step on the whole rollout
            next_value = agent.act(next_obs)[3]
            advantages = torch.zeros_like(rewards)
            last = torch.zeros(NUM_ENVS)
            for t in reversed(range(NUM_STEPS)):
                nonterminal = 1.0 - (next_done if t == NUM_STEPS - 1 else dones[t + 1])
                bootstrap = next_value if t == NUM_STEPS - 1 else values[t + 1]
                delta = rewards[t] + 0.99 * bootstrap * nonterminal - values[t]
                advantages[t] = last = delta + 0.99 * 0.95 * nonterminal * last
            returns = advantages + values
        before = [p.detach().clone() for p in agent.parameters()]
        _, newlogprob, entropy, newvalue = agent.act(obs.reshape(-1, *shape), actions.reshape(-1))
        ratio = (newlogprob - logprobs.reshape(-1)).exp()
        adv = advantages.reshape(-1)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.9, 1.1)).mean()
        loss = pg_loss - 0.01 * entropy.mean() + 0.5 * 0.5 * ((newvalue - returns.reshape(-1)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()
        assert torch.isfinite(loss)
        assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters()))
    finally:
        envs.close()
