"""The end-to-end check's reward (verl's `reward.custom_reward_function`): the fraction of
the response's characters that are digits. A random model's responses differ in it, so
GRPO's advantages are not all zero and the clip bounds have tokens to calibrate on."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    text = solution_str or ""
    return sum(c.isdigit() for c in text) / max(len(text), 1)
