"""The policy model: where it lives (`placement`: loading, preparing, checkpoint save and restore, the KL
reference), its scoring pass (`scoring`: each response token's log-prob, entropy and C(p)), and its update
(`update`: π_old on the step batch and the micro-batched forward/backward of the policy loss)."""
