"""The real-verl jobs' reward function (verl's `reward.custom_reward_function`): 1 for the right
answer after `####`, 0.1 for a wrong one, else a small length-based reward so that a random
model's rewards are not all equal (GRPO's advantages would all be 0)."""

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    found = re.findall(r"####\s*(-?\d+)", solution_str or "")
    if found:
        return 1.0 if found[-1] == str(ground_truth) else 0.1
    return 0.01 * min(len(solution_str or ""), 50) / 50.0
