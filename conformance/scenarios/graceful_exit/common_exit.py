"""OnRequestExit: a signal during training (SIGUSR1, a no-op handler installed first so that an
unhandled signal cannot kill the process), with and without MS_ENABLE_GRACEFUL_EXIT=1.

K: Model, Callback, OnRequestExit, S, env_var_applies (bool: read at construction).
"""

import os
import signal
import tempfile


def scenario(K):
    S = K.S
    out = {}

    class Kill(K.Callback):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_step_end(self, rc):
            self.steps += 1
            if self.steps == 2:
                os.kill(os.getpid(), signal.SIGUSR1)

    for key, env in {"env_unset": None, "env_1": "1"}.items():
        old = signal.signal(signal.SIGUSR1, lambda *a: None)
        prev = os.environ.pop("MS_ENABLE_GRACEFUL_EXIT", None)
        if env is not None:
            os.environ["MS_ENABLE_GRACEFUL_EXIT"] = env
        try:
            with tempfile.TemporaryDirectory() as d:
                n = S.net()
                kill = Kill()
                exit_cb = K.OnRequestExit(
                    save_ckpt=True,
                    save_mindir=False,
                    file_name="Net",
                    directory=d,
                    sig=signal.SIGUSR1,
                )
                K.Model(n, S.loss_fn(), S.opt(n)).train(2, S.train_ds(), callbacks=[kill, exit_cb])
                out[f"{key}.steps_run"] = kill.steps
                out[f"{key}.files"] = sorted(
                    os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs
                )
        finally:
            os.environ.pop("MS_ENABLE_GRACEFUL_EXIT", None)
            if prev is not None:
                os.environ["MS_ENABLE_GRACEFUL_EXIT"] = prev
            signal.signal(signal.SIGUSR1, old)
    return out
