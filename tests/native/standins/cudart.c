/* Stand-in CUDA runtime for CI: the runtime calls the hook and the stand-in
 * libraries make, each passed to the stand-in driver (cuda.c, linked as
 * libcuda.so.1), which models the device, its streams and events. */

int cuEventRecord(void *event, void *stream);
int cuEventQuery(void *event);
int cuEventElapsedTime(float *ms, void *start, void *stop);
int cuEventCreate(void **event, unsigned flags);
int cuEventDestroy_v2(void *event);
int cuStreamCreate(void **stream, unsigned flags);
int cuCtxGetDevice(int *device);

int cudaStreamCreateWithFlags(void **stream, unsigned flags) { return cuStreamCreate(stream, flags); }
int cudaEventCreateWithFlags(void **event, unsigned flags) { return cuEventCreate(event, flags); }
int cudaEventDestroy(void *event) { return cuEventDestroy_v2(event); }
int cudaEventRecord(void *event, void *stream) { return cuEventRecord(event, stream); }
int cudaEventQuery(void *event) { return cuEventQuery(event); }
int cudaEventElapsedTime(float *ms, void *start, void *stop) { return cuEventElapsedTime(ms, start, stop); }
int cudaGetDevice(int *device) { return cuCtxGetDevice(device); }
int cudaSetDevice(int device) { return device == 0 ? 0 : 101; }
