/* GPIO lines on a kernel GPIO character device (uAPI v2, linux/gpio.h): one line request
 * for the engine's pins, driven with GPIO_V2_LINE_SET_VALUES_IOCTL right where the virtual
 * lines record their edges. Compiled everywhere Linux >= 5.10 headers are; NOT validated
 * on hardware here (this machine has no /dev/gpiochip*). */
#include <errno.h>
#include <fcntl.h>
#include <linux/gpio.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "client.h"

int mqe_gpio_open_chip(mqe_engine *e, const char *chip, const int32_t *pins, uint32_t n) {
    if (n == 0 || n > GPIO_V2_LINES_MAX) {
        snprintf(e->error, sizeof e->error, "a GPIO line request holds 1..%d lines, not %u",
                 GPIO_V2_LINES_MAX, n);
        return -EINVAL;
    }
    int fd = open(chip, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int error = errno;
        snprintf(e->error, sizeof e->error, "opening GPIO chip %s: %s", chip, strerror(error));
        return -error;
    }
    struct gpio_v2_line_request request;
    memset(&request, 0, sizeof request);
    for (uint32_t i = 0; i < n; i++) {
        if (pins[i] < 0 || pins[i] >= MQE_GPIO_PINS) {
            close(fd);
            snprintf(e->error, sizeof e->error, "GPIO line %d is outside 0..%d", pins[i],
                     MQE_GPIO_PINS - 1);
            return -EINVAL;
        }
        request.offsets[i] = (uint32_t)pins[i];
        e->line_bit[pins[i]] = (uint8_t)(i + 1);
    }
    request.num_lines = n;
    request.config.flags = GPIO_V2_LINE_FLAG_OUTPUT;
    snprintf(request.consumer, sizeof request.consumer, "mqttbed");
    if (ioctl(fd, GPIO_V2_GET_LINE_IOCTL, &request) < 0) {
        int error = errno;
        close(fd);
        snprintf(e->error, sizeof e->error, "requesting %u lines of %s: %s", n, chip,
                 strerror(error));
        return -error;
    }
    close(fd);  /* the request has its own fd */
    e->line_fd = request.fd;
    return 0;
}

void mqe_gpio_write(mqe_engine *e, int pin, int level) {
    if (e->line_fd < 0 || !e->line_bit[pin])
        return;
    uint64_t bit = 1ULL << (e->line_bit[pin] - 1);
    struct gpio_v2_line_values values = {.bits = level ? bit : 0, .mask = bit};
    ioctl(e->line_fd, GPIO_V2_LINE_SET_VALUES_IOCTL, &values);
}
