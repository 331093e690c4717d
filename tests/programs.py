"""Hand-written TIR programs with odd shapes: two stores into one buffer, loops that never run."""


def concat_and_empty(tvm):
    """(two stores into one buffer, a loop that never runs, a negative extent beside a normal loop)"""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def concat(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32"), C: T.Buffer((32,), "float32")):
        for i in range(16):
            with T.sblock("a"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] + T.float32(1)
        for i in range(16):
            with T.sblock("b"):
                vi = T.axis.spatial(16, i)
                C[vi + 16] = B[vi] * T.float32(2)

    @T.prim_func(s_tir=True)
    def never_runs(A: T.Buffer((16,), "float32"), C: T.Buffer((16,), "float32")):
        for i in range(0):
            with T.sblock("a"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] + T.float32(1)

    @T.prim_func(s_tir=True)
    def negative_extent(A: T.Buffer((16,), "float32"), C: T.Buffer((16,), "float32")):
        for i in range(-5):
            with T.sblock("a"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] + T.float32(1)
        for i in range(16):
            with T.sblock("b"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] * T.float32(2)

    return concat, never_runs, negative_extent
