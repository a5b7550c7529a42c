"""The optimizer compiler, one module per stage in the order data flows:

    loader.load_spec      spec file -> Spec                      (stage 1)
    verify.verify         Spec -> traced updates, or SpecError  (stage 2)
    specialize.specialize trace -> KernelIR (host scalars split) (stage 3)
    lower.lower           KernelIR -> TVMScript statements       (stage 4)
    schedule_llvm         statements -> loops/vectors/threads    (stage 5)
    tvm_backend           TVMScript -> shared library            (stage 6; the only TVM import)
    pipeline.build        runs them all and writes the artifact  (stage 7)
"""
