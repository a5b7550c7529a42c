"""The optimizer compiler, one module per stage in the order data flows:

    loader.load_spec      spec file -> Spec                      (stage 1)
    verify.verify         Spec -> traced updates, or SpecError  (stage 2)
    specialize.specialize trace -> KernelIR (host scalars split) (stage 3)
    lower.lower           KernelIR -> TVMScript statements       (stage 4)
    schedule_llvm         statements -> loops/vectors/threads    (stage 5)
    plan.make_plan        stages 1-5 -> BuildPlan: per kernel and per pass its symbol,
                          TVMScript, grids, shape variables (read by all that follows)
    tvm_backend           TVMScript -> shared library            (stage 6; the only TVM import)
    pipeline.build        runs them all and writes the artifact  (stage 7)

Beside them: kernel_ir (the KernelIR and Launch types and their JSON form),
plan_matrix (the passes of a matrix rule, stage 3), variants (which kernels a target
gets, and their symbols), schedule_gpu, matmul and anchors (stage 5), tvmscript_fast
with tvmscript_rules and tvmscript_walk (TVMScript -> PrimFunc without TVM's parser,
stage 6), abi and nvcc (GPU targets, stage 6, reading the plan), manifest (the artifact's files,
stage 7), targets and templates.
"""
