// Does TMA take a tensor map whose rows overlap? The stem idea (session 28 notes): ResNet-50's 7x7/2 stem as a 4x4
// conv of 16-channel space-to-depth cells, each kernel row read as ONE 128-byte TMA row of 4 pixels x 16 channels:
// dims [64, W - 3, H, N] with the column stride one pixel (32 B), less than a row's 128 B. cuTensorMapEncodeTiled's
// documentation does not say whether a stride below the row's extent is allowed; this program asks the driver and
// the hardware.
//   nvcc -arch=sm_90a -o tma_overlap bench/experiments/tma_overlap.cu -lcuda && ./tma_overlap
// Prints "encode: CUDA_SUCCESS | <error>", then "overlap OK" or the first mismatching element.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>

constexpr int H = 4, W = 16, C = 16, N = 1, BOX_COLS = 8;

__global__ void load_box(const __grid_constant__ CUtensorMap map, __half* out, int col, int row) {
  __shared__ alignas(128) __half tile[BOX_COLS * 64];
  __shared__ alignas(8) unsigned long long bar;
  unsigned bar_at = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  unsigned tile_at = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(bar_at));
    asm volatile("fence.proxy.async.shared::cta;");
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(bar_at), "r"(BOX_COLS * 64 * 2));
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
                 :: "r"(tile_at), "l"(&map), "r"(0), "r"(col), "r"(row), "r"(0), "r"(bar_at) : "memory");
    unsigned done = 0;
    while (!done) {
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(bar_at) : "memory");
    }
    for (int i = 0; i < BOX_COLS * 64; ++i) out[i] = tile[i];
  }
}

int main() {
  cuInit(0);
  std::vector<__half> x(N * H * W * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = __float2half(static_cast<float>(i % 2048));
  __half *dx, *dout;
  cudaMalloc(&dx, x.size() * 2);
  cudaMalloc(&dout, BOX_COLS * 64 * 2);
  cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  CUtensorMap map;
  cuuint64_t dims[4] = {64, W - 3, H, N};
  cuuint64_t strides[3] = {C * 2, W * C * 2, H * W * C * 2};  // the column stride: one pixel, 32 B < the row's 128 B
  cuuint32_t box[4] = {64, BOX_COLS, 1, 1}, elem[4] = {1, 1, 1, 1};
  CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, dx, dims, strides, box, elem,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                      CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  printf("encode: %s\n", name ? name : "?");
  if (r != CUDA_SUCCESS) return 1;
  const int col = 8, row = 2;  // box columns 5-7 lie past W - 3: zeros
  load_box<<<1, 32>>>(map, dout, col, row);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("kernel: %s\n", cudaGetErrorString(e)); return 1; }
  std::vector<__half> out(BOX_COLS * 64);
  cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost);
  for (int j = 0; j < BOX_COLS; ++j) {
    for (int i = 0; i < 64; ++i) {
      int c = col + j;  // box column j: pixels c .. c + 3 of the row, 16 channels each, with zeros past W - 3
      float want = c < W - 3 ? __half2float(x[(row * W + c) * C + i]) : 0.0f;
      float got = __half2float(out[j * 64 + i]);
      if (got != want) { printf("mismatch at box column %d element %d: %g, want %g\n", j, i, got, want); return 1; }
    }
  }
  printf("overlap OK\n");
  return 0;
}
