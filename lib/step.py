"""One optimizer step of training, as train.py's loop takes it and bench/speed.py times it: the
micro-batches' forward and backward passes, their gradients summed (and reduced over the
processes once), clipped, then the optimizers' update."""

import torch

from lib.common import autocast
from lib.distributed import clip_gradients, grad_scaler, micro_step


class TrainStep:
    """One run's step: its model, optimizers, processes (a lib.distributed.Run) and clipping."""

    def __init__(self, model, raw_model, optimizers, run, grad_clip):
        """model: what the forward runs through (the model, DDP's wrapper or torch.compile's);
        raw_model: the model itself (under FSDP this process's shards); grad_clip 0: no clipping."""
        self.model = model
        self.raw_model = raw_model
        self.optimizers = optimizers
        self.run = run
        self.grad_clip = grad_clip
        self.ctx = autocast(run.device, run.dtype)
        self.scaler = grad_scaler(run)  # float16's loss scaler; disabled otherwise

    def gradients(self, batches):
        """The micro-batches' gradients, summed: (the mean loss, the gradient's norm before
        clipping), tensors on the device (read them together: one sync)."""
        loss_sum = torch.zeros((), device=self.run.device)
        for i, batch in enumerate(batches):
            # the gradients reduced over the processes once, in the step's last micro-step
            with micro_step(self.model, self.run, last=i == len(batches) - 1):
                with self.ctx:
                    _, loss = self.model(**batch)
                    loss = loss / len(batches)
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        for optimizer in self.optimizers:
            self.scaler.unscale_(optimizer)
        max_norm = self.grad_clip or float("inf")
        return loss_sum, clip_gradients(self.raw_model, max_norm, self.run)

    def update(self):
        """The optimizers step on the gradients (fp16's scaler skips a step of inf or NaN), which
        are then dropped."""
        for optimizer in self.optimizers:
            self.scaler.step(optimizer)
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        self.scaler.update()
