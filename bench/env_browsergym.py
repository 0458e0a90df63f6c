"""BrowserGym's MiniWoB env on the shared episode plan (run inside the BrowserGym venv by
env_steps.py; one process is one env). Prints one JSON line: {"steps": n, "wall_s": s}.

    python bench/env_browsergym.py --miniwob-url http://127.0.0.1:PORT/miniwob/ --first 0 --count 8
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from env_plan import MAX_STEPS, click_point, episode_plan  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--miniwob-url", required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=8)
    args = parser.parse_args()
    os.environ["MINIWOB_URL"] = args.miniwob_url

    import browsergym.miniwob  # noqa: F401 — registers the browsergym/miniwob.* envs
    import gymnasium as gym
    from browsergym.core.action.highlevel import HighLevelActionSet

    actions = HighLevelActionSet(subsets=["coord"])
    envs = {}
    steps = 0
    started = time.perf_counter()
    for index, task, seed in episode_plan(args.count, args.first):
        if task not in envs:
            # The fastest settings BrowserGym offers: no slow-motion, no pre-observation delay.
            envs[task] = gym.make(f"browsergym/miniwob.{task}", headless=True, slow_mo=0, pre_observation_delay=0,
                                  action_mapping=actions.to_python_code)
        env = envs[task]
        env.reset(seed=seed)
        for step in range(MAX_STEPS):
            x, y = click_point(index, step)
            # BrowserGym zooms MiniWoB pages by 1.5: page coordinates scale with it.
            _, _, terminated, truncated, _ = env.step(f"mouse_click({x * 1.5:.1f}, {y * 1.5:.1f})")
            steps += 1
            if terminated or truncated:
                break
    wall = time.perf_counter() - started
    for env in envs.values():
        env.close()
    print(json.dumps({"steps": steps, "wall_s": wall}))


if __name__ == "__main__":
    main()
