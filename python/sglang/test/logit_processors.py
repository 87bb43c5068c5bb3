"""Custom logit processors for tests, built the way a client builds one: the class is defined in
the client's `__main__` and serialised with `CustomLogitProcessor.to_str()` (dill), so the server
must unpickle it (which is why it needs `--enable-custom-logit-processor` and the admin key)."""

FORCE_TOKEN_SRC = """
class ForceToken(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list=None):
        for i, p in enumerate(custom_param_list):
            keep = logits[i, p["token_id"]].clone()
            logits[i, :] = float("-inf")
            logits[i, p["token_id"]] = keep
        return logits
"""


def force_token_processor() -> str:
    """A processor that keeps only `custom_params["token_id"]`'s logit, as its wire string."""
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}  # as in a client's script
    exec(FORCE_TOKEN_SRC, ns)
    return ns["ForceToken"].to_str()
