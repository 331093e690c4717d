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


# A warp-wide tensor-core GEMM as TVM prints a lowered wmma kernel (the form Ansor/AutoTVM imports take): two thread
# blocks of one warp, each 4 x 16x16x16 mma_sync (2 * 16^3 * 4 * 2 = 65,536 FLOPs); threadIdx.x holds the warp's lanes.
WMMA_TVMSCRIPT = """# from tvm.script import ir as I
# from tvm.script import tir as T

@I.ir_module
class Module:
    @T.prim_func
    def main(C: T.Buffer((32, 16), "float16"), A: T.Buffer((32, 64), "float16"), B: T.Buffer((64, 16), "float16")):
        T.func_attr({"tir.noalias": T.bool(True)})
        blockIdx_x = T.launch_thread("blockIdx.x", 2)
        threadIdx_x = T.launch_thread("threadIdx.x", 32)
        acc = T.alloc_buffer((256,), "float16", scope="wmma.accumulator")
        a = T.alloc_buffer((256,), "float16", scope="wmma.matrix_a")
        b = T.alloc_buffer((256,), "float16", scope="wmma.matrix_b")
        T.tvm_fill_fragment(acc.data, 16, 16, 16, 0, T.float32(0.0))
        for k in range(4):
            T.tvm_load_matrix_sync(a.data, 16, 16, 16, 0, T.tvm_access_ptr(T.type_annotation("float16"), A.data, blockIdx_x * 1024 + k * 16, 1024, 1), 64, "row_major")
            T.tvm_load_matrix_sync(b.data, 16, 16, 16, 0, T.tvm_access_ptr(T.type_annotation("float16"), B.data, k * 256, 256, 1), 16, "row_major")
            T.tvm_mma_sync(acc.data, 0, a.data, 0, b.data, 0, acc.data, 0)
        T.tvm_store_matrix_sync(acc.data, 16, 16, 16, 0, T.tvm_access_ptr(T.type_annotation("float16"), C.data, blockIdx_x * 256, 256, 2), 16, "row_major")
"""
