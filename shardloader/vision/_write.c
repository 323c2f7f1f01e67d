/* The fused path's last write (shardloader/vision/_write.py builds and loads this file;
 * docs/vision.md, "Compiled helpers").
 *
 * Each function takes one rendered uint8 image, `height` x `width` pixels of `channels`
 * (1 or 3) interleaved bytes, rows `row_stride` bytes apart (a view of a larger image
 * works), and writes its planes, (channels, height, width) C-contiguous, into `out`,
 * flipping left-right (`flip_x`) and top-bottom (`flip_y`) as it reads. In one pass, where
 * OpenCV takes three: a flip into a buffer, a split into planes, and a lookup per plane.
 *
 * sl_planes_f32 maps every value through its channel's row of `table` (channels x 256
 * float32: ToTensor and Normalize, precomputed), so the results are the table's very
 * numbers; sl_planes_u8 copies the bytes. Both return nonzero for a channel count they do
 * not take, having written nothing.
 */
#include <stddef.h>
#include <stdint.h>

int sl_planes_f32(const uint8_t *src, int height, int width, int channels, long row_stride,
                  int flip_x, int flip_y, const float *table, float *out) {
    size_t plane = (size_t)height * (size_t)width;
    int y, x;
    if (channels != 1 && channels != 3) {
        return 1;
    }
    for (y = 0; y < height; y++) {
        const uint8_t *row = src + (size_t)(flip_y ? height - 1 - y : y) * (size_t)row_stride;
        float *o0 = out + (size_t)y * (size_t)width;
        /* Read forwards, or from the row's last pixel backwards. */
        const uint8_t *first = flip_x ? row + (size_t)(width - 1) * (size_t)channels : row;
        long step = flip_x ? -channels : channels;
        if (channels == 1) {
            for (x = 0; x < width; x++) {
                o0[x] = table[first[x * step]];
            }
        } else {
            const float *t0 = table, *t1 = table + 256, *t2 = table + 512;
            float *o1 = o0 + plane, *o2 = o1 + plane;
            for (x = 0; x < width; x++) {
                const uint8_t *p = first + x * step;
                o0[x] = t0[p[0]];
                o1[x] = t1[p[1]];
                o2[x] = t2[p[2]];
            }
        }
    }
    return 0;
}

int sl_planes_u8(const uint8_t *src, int height, int width, int channels, long row_stride,
                 int flip_x, int flip_y, uint8_t *out) {
    size_t plane = (size_t)height * (size_t)width;
    int y, x;
    if (channels != 1 && channels != 3) {
        return 1;
    }
    for (y = 0; y < height; y++) {
        const uint8_t *row = src + (size_t)(flip_y ? height - 1 - y : y) * (size_t)row_stride;
        uint8_t *o0 = out + (size_t)y * (size_t)width;
        const uint8_t *first = flip_x ? row + (size_t)(width - 1) * (size_t)channels : row;
        long step = flip_x ? -channels : channels;
        if (channels == 1) {
            for (x = 0; x < width; x++) {
                o0[x] = first[x * step];
            }
        } else {
            uint8_t *o1 = o0 + plane, *o2 = o1 + plane;
            for (x = 0; x < width; x++) {
                const uint8_t *p = first + x * step;
                o0[x] = p[0];
                o1[x] = p[1];
                o2[x] = p[2];
            }
        }
    }
    return 0;
}
