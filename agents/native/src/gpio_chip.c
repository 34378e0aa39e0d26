/* GPIO lines on a kernel GPIO character device (uAPI v2, linux/gpio.h): one line request
 * for the engine's pins, driven with GPIO_V2_LINE_SET_VALUES_IOCTL right where the edges
 * are recorded (io.c). Compiled everywhere Linux >= 5.10 headers are. Validated against
 * tests/fakes/fake_gpiochip.c, an LD_PRELOAD chip answering the same ioctls with the
 * kernel's checks, and against a real kernel's gpiolib and PL061 driver: Debian's arm64
 * kernel on QEMU's emulated `virt` board (tests/test_lab_vm_gpio.py, which reads the lines
 * back from QEMU's trace). NOT on a Pi's BCM2835/RP1 chip: there is none here. */
#include <errno.h>
#include <fcntl.h>
#include <linux/gpio.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "client.h"

int mqe_gpio_open_chip(mqe_engine *e, const char *chip, const int32_t *pins, uint32_t n) {
    if (e->line_fd >= 0) {
        snprintf(e->error, sizeof e->error, "this engine already holds a GPIO line request");
        return -EBUSY;
    }
    if (n == 0 || n > GPIO_V2_LINES_MAX) {
        snprintf(e->error, sizeof e->error, "a GPIO line request holds 1..%d lines, not %u",
                 GPIO_V2_LINES_MAX, n);
        return -EINVAL;
    }
    struct gpio_v2_line_request request;
    memset(&request, 0, sizeof request);
    for (uint32_t i = 0; i < n; i++) {
        if (pins[i] < 0 || pins[i] >= MQE_GPIO_PINS) {
            snprintf(e->error, sizeof e->error, "GPIO line %d is outside 0..%d", pins[i],
                     MQE_GPIO_PINS - 1);
            return -EINVAL;
        }
        for (uint32_t j = 0; j < i; j++)
            if (pins[j] == pins[i]) {
                snprintf(e->error, sizeof e->error,
                         "GPIO line %d is named twice in one request", pins[i]);
                return -EINVAL;
            }
        request.offsets[i] = (uint32_t)pins[i];
    }
    request.num_lines = n;
    request.config.flags = GPIO_V2_LINE_FLAG_OUTPUT;  /* no output_values attribute: low */
    snprintf(request.consumer, sizeof request.consumer, "mqttbed");
    int fd = open(chip, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int error = errno;
        snprintf(e->error, sizeof e->error, "opening GPIO chip %s: %s", chip, strerror(error));
        return -error;
    }
    if (ioctl(fd, GPIO_V2_GET_LINE_IOCTL, &request) < 0) {
        int error = errno;
        close(fd);
        snprintf(e->error, sizeof e->error, "requesting %u lines of %s: %s", n, chip,
                 strerror(error));
        return -error;
    }
    close(fd);  /* the request has its own fd */
    for (uint32_t i = 0; i < n; i++) {
        e->line_bit[pins[i]] = (uint8_t)(i + 1);
        e->levels[pins[i]] = 0;
    }
    e->line_fd = request.fd;
    return 0;
}

int64_t mqe_gpio_write(mqe_engine *e, int pin, int level, int64_t t_edge_ns) {
    if (e->line_fd < 0 || !e->line_bit[pin])
        return 0;
    uint64_t bit = 1ULL << (e->line_bit[pin] - 1);
    struct gpio_v2_line_values values = {.bits = level ? bit : 0, .mask = bit};
    if (ioctl(e->line_fd, GPIO_V2_LINE_SET_VALUES_IOCTL, &values) < 0) {
        e->line_write_errno = errno;
        e->line_write_failures++;
    }
    return mqe_now_ns() - t_edge_ns;
}

int mqe_gpio_set(mqe_engine *e, int pin, int level) {
    if (pin < 0 || pin >= MQE_GPIO_PINS || e->line_fd < 0 || !e->line_bit[pin])
        return -ENOENT;
    uint64_t bit = 1ULL << (e->line_bit[pin] - 1);
    struct gpio_v2_line_values values = {.bits = level ? bit : 0, .mask = bit};
    if (ioctl(e->line_fd, GPIO_V2_LINE_SET_VALUES_IOCTL, &values) < 0)
        return -errno;
    e->levels[pin] = (uint8_t)(level != 0);
    return 0;
}

int64_t mqe_gpio_write_failures(const mqe_engine *e, int *last_errno) {
    if (last_errno != NULL)
        *last_errno = e->line_write_errno;
    return e->line_write_failures;
}
